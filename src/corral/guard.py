"""Guard: which directories may become writable, and what stays protected inside them.

A writable bind of the wrong directory is the seed's escape: launched from
``~``, ``--bind "$PWD"`` made ``~/.bashrc`` writable.  Every directory that
corral makes writable (a reused workspace, an agent's project) passes
:func:`check_writable_root` first, after symlinks are resolved, so that a
symlinked path cannot widen anything.

What must stay read-only or hidden *inside* writable trees is found by
:mod:`corral.discover` (and :mod:`corral.repos` for git), as :class:`Finding`.
"""

from __future__ import annotations

import os

from . import small
from .errors import UsageError
from .host import HostFacts
from .policy import check_path
from .record import NamedTuple

__all__ = ["CREDENTIAL_DIRS", "PROTECTED_NAMES", "VCS_CONTROLS", "Finding", "check_workspace",
           "check_writable_root", "userns_hint", "vcs_control"]

# Never writable themselves, nor anything beneath them.
SYSTEM_TREES = ("/usr", "/etc", "/boot", "/proc", "/sys", "/dev", "/run", "/bin", "/sbin",
                "/lib", "/lib32", "/lib64", "/libx32", "/var/run", "/var/lib/dpkg")
# Never writable themselves (their subdirectories may be projects).
SYSTEM_DIRS = ("/", "/var", "/var/lib", "/var/tmp", "/var/cache", "/var/log", "/tmp", "/opt",
               "/srv", "/home", "/root", "/mnt", "/media", "/snap", "/nix", "/dev/shm")
# A directory holding any of these is someone's home (or a copy of one).
CREDENTIAL_DIRS = (".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".password-store",
                   ".config/gcloud", ".config/gh", ".local/share/keyrings", ".netrc",
                   ".git-credentials", ".pgpass", ".vault-token")

# Files and folders that something on the host executes or trusts later (found by
# :mod:`corral.discover`, compared by :mod:`corral.audit` after every run): an agent that
# could rewrite them would escape the sandbox the next time the user runs git, their
# shell, their editor, a hook manager or their agent without corral.
PROTECTED_NAMES = frozenset({
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases", ".profile",
    ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".cshrc", ".tcshrc", ".login",
    ".kshrc", ".mkshrc", ".inputrc", ".gitmodules", ".vscode", ".idea", ".claude", ".codex",
    ".gemini", ".cursor", ".pi", ".continue", ".aider.conf.yml", ".mcp.json",
    # Mercurial's subrepositories: hg opens each (and loads its config) on commit
    ".hgsub",
    # hook managers: git runs what these name
    ".husky", ".githooks", ".git-hooks", ".pre-commit-config.yaml", ".pre-commit-hooks.yaml",
    "lefthook.yml", "lefthook.yaml", ".lefthook.yml", ".lefthook.yaml", "lefthook-local.yml",
    ".overcommit.yml",
    # editors and tools that start what a project's settings name when it is opened:
    # Helix's language servers, VS Code's devcontainer initializeCommand (run on the host),
    # Zed, Neovim's and Vim's exrc, Emacs' directory locals
    ".helix", ".devcontainer", ".devcontainer.json", ".zed", ".nvim.lua", ".nvimrc", ".exrc",
    ".lazy.lua", ".dir-locals.el", ".dir-locals-2.el",
    # other agents' project settings and MCP servers
    ".windsurf", ".kiro", ".roo", ".amazonq", ".opencode", "opencode.json", "opencode.jsonc",
})

# Other version controls' files that make their command on the host run a program, known by
# their place in the tree (the names alone are too common to protect anywhere): Mercurial's
# repository config (its hooks run on `hg status`), the config it reads beside it, and the
# pointer of a share to the store it uses (whose config a share-safe repository reads too);
# Jujutsu's repository and workspace config (jj moves one it finds into its own config
# folder and uses it: `ui.pager` runs on `jj log`) and the ids naming that copy.  The
# pointer of a jj workspace to its repository, ``.jj/repo`` when it is not a folder, counts
# too (see vcs_control).
VCS_CONTROLS = ((".hg", "hgrc"), (".hg", "hgrc-not-shared"), (".hg", "sharedpath"),
                (".jj", "repo", "config.toml"), (".jj", "repo", "config-id"),
                (".jj", "workspace-config.toml"), (".jj", "workspace-config-id"))


def vcs_control(path: str, kind: str) -> bool:
    """Whether ``path`` (its last components) is one of :data:`VCS_CONTROLS`; or a
    ``.hg`` or ``.jj`` that is not a folder (hg and jj follow a link there to a folder of
    any name, whose ``hgrc`` no rule above names: review 25), or a jj workspace's pointer
    to its repository (``.jj/repo``, anything but a folder)."""
    parts = tuple(path.rsplit("/", 3)[-3:])
    if kind != "dir" and (parts[-1] in (".hg", ".jj") or parts[-2:] == (".jj", "repo")):
        return True
    return any(parts[-len(c):] == c for c in VCS_CONTROLS)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_writable_root(path: str, what: str, home: str | None = None, *,
                        corrals_own: bool = False) -> str:
    """Resolve ``path`` and refuse it if making it writable would expose too much.

    Refused: ``/``, the home directory and its ancestors, system directories,
    and any directory that holds credential directories such as ``.ssh`` (unless
    ``corrals_own``: a workspace corral made, where only its payloads put anything).
    Returns the resolved path.
    """
    check_path(os.path.abspath(path), what)
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise UsageError(f"{what} {path} is not a directory", "",
                         "create it first, or pick an existing directory")
    shown = path if real == path else f"{path} (really {real})"
    if real == "/":
        raise UsageError(f"refusing to make {shown} writable: it is the root directory",
                         "the sandbox could then rewrite the whole system",
                         "run from a project directory such as ~/src/myproject")
    if any(_contains_home(real, h) for h in _homes(home)):
        raise UsageError(
            f"refusing to make {shown} writable: it is the home directory or contains it",
            "the sandbox could then rewrite shell start-up files such as ~/.bashrc",
            "run from a project directory such as ~/src/myproject",
        )
    if real in SYSTEM_DIRS or any(_under(real, t) for t in SYSTEM_TREES):
        raise UsageError(f"refusing to make {shown} writable: it is a system directory",
                         "the sandbox must never write there",
                         "run from a project directory such as ~/src/myproject")
    found = _credentials_in(real)
    if found and not corrals_own:
        raise UsageError(
            f"refusing to make {shown} writable: it holds credentials ({', '.join(found)})",
            "a directory with credential folders looks like a home directory",
            "run from a project directory that holds no credentials",
        )
    return real


def _credentials_in(real: str) -> list[str]:
    """The credential names present in ``real``, looked up through fsops (the folder may be
    a payload's to change): a link on the way (``ELOOP``) is not followed, and not counted."""
    from . import fsops  # only agent and workspace checks need it

    found = []
    with fsops.Tree(real) as tree:
        for name in CREDENTIAL_DIRS:
            try:
                if tree.lstat(name) is not None:
                    found.append(name)
            except OSError:
                continue  # not a folder on the way, or a link: nothing there to protect
    return found


def _homes(home: str | None) -> set[str]:
    """The home directories to keep read-only: the one given, $HOME, and the passwd one."""
    import pwd

    homes = {home or os.path.expanduser("~"), os.environ.get("HOME", "")}
    with small.suppress(KeyError):
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    return {os.path.realpath(h) for h in homes if h}


def _contains_home(real: str, home: str) -> bool:
    """Whether directory ``real`` is ``home`` or one of its ancestors.

    Compared by device and inode, not only by path: a bind mount or a second
    path to the home directory must not pass for a project.
    """
    if real == home or _under(home, real):
        return True
    try:
        target = os.stat(real)
        probe = os.stat(home)
    except OSError:
        return False
    here = home
    while True:
        if (probe.st_dev, probe.st_ino) == (target.st_dev, target.st_ino):
            return True
        parent = os.path.dirname(here)
        if parent == here:
            return False
        here = parent
        try:
            probe = os.stat(here)
        except OSError:
            return False


def check_workspace(path: str, corrals_own: bool = False) -> str:
    """A reused workspace, checked as a writable root.

    ``corrals_own`` says corral made it (a compile step's, an MCP session's): folders named
    like credentials there were written by its payloads, not found in a home directory, and
    refusing them would only lock the session out of its own files."""
    return check_writable_root(path, "workspace", corrals_own=corrals_own)


def userns_hint(host: HostFacts) -> str:
    """Why bwrap may fail to create namespaces here, for error messages."""
    if host.apparmor_restricts_userns:
        return (" (AppArmor restricts unprivileged user namespaces: "
                "kernel.apparmor_restrict_unprivileged_userns=1)")
    if host.userns_max == 0:
        return " (user.max_user_namespaces is 0)"
    return ""


# The placeholder corral puts where a git directory has no commondir: the git directory
# itself, which git reads as none (corral.repos; removed after the run by corral.audit).
SELF_COMMONDIR = b".\n"


class Finding(NamedTuple):
    """A path inside a writable tree that corral re-mounts, and why (see corral.discover)."""

    path: str  # absolute host path (also the path inside)
    # "protect" (read-only), "hide" (empty, read-only), "pin" (bound onto itself); "watch"
    # (missing, mounts nothing: one made during the run is a plant, see corral.audit)
    action: str
    kind: str  # "file" or "dir"
    reason: str
    # "": found there; "placeholder": an empty file corral made so that nothing else can be
    # created there (removed after the run); "planned": --dry-run, would be made at launch
    origin: str = ""
