"""Guard: which directories may become writable, and what stays protected inside them.

A writable bind of the wrong directory is the seed's escape: launched from
``~``, ``--bind "$PWD"`` made ``~/.bashrc`` writable.  Every directory that
corral makes writable (a reused workspace, an agent's project) passes
:func:`check_writable_root` first, after symlinks are resolved, so that a
symlinked path cannot widen anything.

Inside writable trees, :func:`scan` finds what must not be writable (git
hooks and config, shell start-up files, editor and agent configuration) or
visible (secret-looking files), at any depth, in nested and git-ignored
repositories too; it fails closed when it cannot finish.
:func:`verify_unchanged` re-checks every destination component by component
just before launch, because bwrap 0.8 follows symlinks during setup.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import UsageError
from .host import HostFacts
from .policy import check_path

__all__ = ["CREDENTIAL_DIRS", "Finding", "check_workspace", "check_writable_root", "scan",
           "userns_hint", "verify_unchanged"]

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


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_writable_root(path: str, what: str, home: str | None = None) -> str:
    """Resolve ``path`` and refuse it if making it writable would expose too much.

    Refused: ``/``, the home directory and its ancestors, system directories,
    and any directory that holds credential directories such as ``.ssh``.
    Returns the resolved path.
    """
    check_path(os.path.abspath(path), what)
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise UsageError(f"{what} {path} is not a directory", "",
                         "create it first, or pick an existing directory")
    home = os.path.realpath(home or os.path.expanduser("~"))
    shown = path if real == path else f"{path} (really {real})"
    if real == "/":
        raise UsageError(f"refusing to make {shown} writable: it is the root directory",
                         "the sandbox could then rewrite the whole system",
                         "run from a project directory such as ~/src/myproject")
    if real == home or _under(home, real):
        raise UsageError(
            f"refusing to make {shown} writable: it is the home directory or contains it",
            "the sandbox could then rewrite shell start-up files such as ~/.bashrc",
            "run from a project directory such as ~/src/myproject",
        )
    if real in SYSTEM_DIRS or any(_under(real, t) for t in SYSTEM_TREES):
        raise UsageError(f"refusing to make {shown} writable: it is a system directory",
                         "the sandbox must never write there",
                         "run from a project directory such as ~/src/myproject")
    found = [c for c in CREDENTIAL_DIRS if os.path.lexists(os.path.join(real, c))]
    if found:
        raise UsageError(
            f"refusing to make {shown} writable: it holds credentials ({', '.join(found)})",
            "a directory with credential folders looks like a home directory",
            "run from a project directory that holds no credentials",
        )
    return real


def check_workspace(path: str) -> str:
    return check_writable_root(path, "workspace")


def userns_hint(host: HostFacts) -> str:
    """Why bwrap may fail to create namespaces here, for error messages."""
    if host.apparmor_restricts_userns:
        return (" (AppArmor restricts unprivileged user namespaces: "
                "kernel.apparmor_restrict_unprivileged_userns=1)")
    if host.userns_max == 0:
        return " (user.max_user_namespaces is 0)"
    return ""


# --- discovery: what must stay read-only or hidden inside writable trees -----------------

# Files and folders that something on the host executes or trusts later: an agent that
# could rewrite them would escape the sandbox the next time the user runs git, their
# shell, their editor or their agent without corral.  Read-only wherever they appear.
PROTECTED_NAMES = frozenset({
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc",
    ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".cshrc", ".tcshrc", ".login", ".kshrc",
    ".mkshrc", ".gitmodules", ".vscode", ".idea", ".claude", ".codex", ".gemini", ".cursor",
    ".pi", ".continue", ".aider.conf.yml", ".mcp.json",
})
# Inside a git directory: what git runs or obeys (hooks, config, per-worktree config).
GIT_PROTECTED = ("hooks", "config", "config.worktree", "info")
# Secret-looking names, hidden (an empty read-only file or folder) unless allowed.
SECRET_GLOBS = (".env", ".env.*", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
                "*.keystore", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk",
                "id_ed25519_sk", ".netrc", ".npmrc", ".pypirc", ".git-credentials", ".pgpass")
SECRET_TEMPLATES = (".env.example", ".env.sample", ".env.template", ".env.dist",
                    ".env.defaults")
SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure",
                         ".password-store"})
MAX_SCANNED = 500_000  # entries; past this the scan fails closed
MAX_MASKS = 4_000  # protected and hidden paths; bwrap and the kernel cap mounts


@dataclass(frozen=True, slots=True)
class Finding:
    """A path inside a writable tree that corral re-mounts, and why."""

    path: str  # absolute host path (also the path inside)
    action: str  # "protect" (read-only), "hide" (empty, read-only), "pin" (.git: no rename)
    kind: str  # "file" or "dir"
    reason: str


def _is_secret(name: str, allowed: Sequence[str]) -> bool:
    if name in SECRET_TEMPLATES or any(fnmatch.fnmatchcase(name, g) for g in allowed):
        return False
    return any(fnmatch.fnmatchcase(name, g) for g in SECRET_GLOBS)


def _refuse_symlink(path: str, why: str) -> UsageError:
    return UsageError(
        f"{path} is a symbolic link, so corral cannot keep it read-only",
        f"{why}; a link there can point the host's tools at files the agent controls",
        "inspect it, replace the link with the real file or folder, and start again",
    )


def _git_findings(gitdir: str) -> Iterator[Finding]:
    """A repository's git directory: pinned in place, its hooks and config read-only."""
    yield Finding(gitdir, "pin", "dir", "git directory: cannot be renamed or replaced")
    for name in GIT_PROTECTED:
        path = os.path.join(gitdir, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if name == "hooks":  # an agent could create it: make it exist, then protect it
                os.mkdir(path, 0o755)
                owner = os.stat(gitdir)
                if os.geteuid() == 0:
                    os.chown(path, owner.st_uid, owner.st_gid)
                yield Finding(path, "protect", "dir", "git hooks run on the host")
            continue
        if stat.S_ISLNK(st.st_mode):
            raise _refuse_symlink(path, "git follows it when it runs hooks or reads config")
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
        yield Finding(path, "protect", kind, "git runs or obeys it on the host")
    modules = os.path.join(gitdir, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        for root, dirs, files in os.walk(modules):
            if "HEAD" in files and "config" in files:  # a submodule's git directory
                dirs.clear()
                yield from (f for f in _git_findings(root) if f.action != "pin")


def scan(root: str, allowed_secrets: Sequence[str] = (),
         extra_protected: Sequence[str] = ()) -> list[Finding]:
    """Every protected, hidden and pinned path beneath the writable tree ``root``.

    Walks without following symlinks; fails closed (UsageError) when the tree is
    larger than MAX_SCANNED entries, cannot be read, or needs more than MAX_MASKS
    mounts.
    """
    protected = PROTECTED_NAMES | set(extra_protected)
    found: list[Finding] = []
    stack = [root]
    count = 0
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as e:
            raise UsageError(f"cannot scan {directory}", e.strerror or str(e),
                             "fix its permissions, or start the agent elsewhere") from None
        count += len(entries)
        if count > MAX_SCANNED:
            raise UsageError(
                f"{root} holds more than {MAX_SCANNED} entries",
                "corral scans every writable tree for secrets, hooks and repositories "
                "and refuses to start when it cannot finish",
                "start the agent in a smaller project directory")
        for entry in entries:
            found.extend(_classify(entry, protected, allowed_secrets, stack))
    if len(found) > MAX_MASKS:
        raise UsageError(f"{root} needs {len(found)} protected or hidden paths",
                         f"corral mounts at most {MAX_MASKS}",
                         "start the agent in a smaller project directory")
    return found


def _classify(entry: os.DirEntry[str], protected: set[str] | frozenset[str],
              allowed_secrets: Sequence[str], stack: list[str]) -> Iterator[Finding]:
    name, path = entry.name, entry.path
    is_link = entry.is_symlink()
    is_dir = not is_link and entry.is_dir(follow_symlinks=False)
    if name == ".git":
        if is_link:
            raise _refuse_symlink(path, "git follows it to find hooks and config")
        if is_dir:
            yield from _git_findings(path)
        else:  # a worktree or submodule checkout: "gitdir: ..." decides where hooks live
            yield Finding(path, "protect", "file", "points git at a git directory")
        return
    if name in protected:
        if is_link:
            raise _refuse_symlink(path, "the host's tools read or run it")
        yield Finding(path, "protect", "dir" if is_dir else "file",
                      "run or trusted by tools on the host")
        return
    if not is_link and ((is_dir and name in SECRET_DIRS) or _is_secret(name, allowed_secrets)):
        yield Finding(path, "hide", "dir" if is_dir else "file", "looks like a secret")
        return
    if is_dir:
        stack.append(path)


def verify_unchanged(root: str, findings: Sequence[Finding]) -> None:
    """Just before launch: every mount destination under ``root`` is reached through real
    directories only (bwrap 0.8 follows symlinks while setting up, DESIGN fact 7)."""
    top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for f in findings:
            rel = os.path.relpath(f.path, root)
            if rel.startswith(".."):
                continue
            _walk_components(top, rel.split("/"), f)
    finally:
        os.close(top)


def _walk_components(top: int, parts: list[str], f: Finding) -> None:
    fd = top
    try:
        for i, part in enumerate(parts):
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = nxt
            mode = os.fstat(fd).st_mode
            last = i == len(parts) - 1
            if stat.S_ISLNK(mode) or (not last and not stat.S_ISDIR(mode)) or (
                    last and stat.S_ISDIR(mode) != (f.kind == "dir")):
                raise UsageError(f"{f.path} changed while corral was starting",
                                 "a path component is now a symlink or another kind of file",
                                 "stop whatever is changing the project and start again")
    except FileNotFoundError:
        raise UsageError(f"{f.path} disappeared while corral was starting", "",
                         "start again") from None
    finally:
        if fd != top:
            os.close(fd)
