"""Discovery: what must stay read-only or hidden inside the writable trees of an agent.

:func:`scan` walks a writable tree (the project, an agent's state folder)
and finds, at any depth, in nested and git-ignored repositories too:

* what the host later runs or trusts: git directories and what git obeys
  (see :mod:`corral.repos`), shell start-up files, editor, agent and
  hook-manager configuration: kept read-only;
* secret-looking files and folders: made to appear empty.

It fails closed: an unreadable folder, a tree too large to finish, a
protected or secret name that is a symbolic link or has other hard links
(the other name would stay writable or readable) stop the launch.
:func:`verify_unchanged` re-checks every destination component by component
just before launch (bwrap 0.8 follows symlinks while setting up, DESIGN fact
7) and returns what corral's init checks once more inside the sandbox: that
every re-mount really sits where it should (another sandbox in the same
project could have raced bwrap's setup).
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence

from . import repos
from .errors import UsageError
from .guard import Finding

__all__ = ["MAX_MASKS", "MAX_SCANNED", "PROTECTED_NAMES", "scan", "verify_unchanged"]

# Files and folders that something on the host executes or trusts later: an agent that
# could rewrite them would escape the sandbox the next time the user runs git, their
# shell, their editor, a hook manager or their agent without corral.
PROTECTED_NAMES = frozenset({
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases", ".profile",
    ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".cshrc", ".tcshrc", ".login",
    ".kshrc", ".mkshrc", ".inputrc", ".gitmodules", ".vscode", ".idea", ".claude", ".codex",
    ".gemini", ".cursor", ".pi", ".continue", ".aider.conf.yml", ".mcp.json",
    # hook managers: git runs what these name
    ".husky", ".githooks", ".git-hooks", ".pre-commit-config.yaml", ".pre-commit-hooks.yaml",
    "lefthook.yml", "lefthook.yaml", ".lefthook.yml", ".lefthook.yaml", "lefthook-local.yml",
    ".overcommit.yml",
})
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


def _is_secret(name: str, allowed: Sequence[str]) -> bool:
    if name in SECRET_TEMPLATES or any(fnmatch.fnmatchcase(name, g) for g in allowed):
        return False
    return any(fnmatch.fnmatchcase(name, g) for g in SECRET_GLOBS)


def _refuse(path: str, what: str, why: str) -> UsageError:
    return UsageError(f"{path} {what}, so corral cannot keep it from the agent", why,
                      "inspect it (a previous sandboxed session may have planted it), replace "
                      "it with a plain file or folder, and start again")


def scan(root: str, allowed_secrets: Sequence[str] = (), extra_protected: Sequence[str] = (),
         roots: Sequence[str] = ()) -> list[Finding]:
    """Every protected, hidden and pinned path beneath the writable tree ``root``.

    ``roots`` are all the writable trees of the sandbox (default: ``root``).
    Walks without following symlinks; fails closed (UsageError) when the tree
    is larger than MAX_SCANNED entries, cannot be read, or needs more than
    MAX_MASKS mounts.
    """
    roots = tuple(roots) or (root,)
    protected = PROTECTED_NAMES | set(extra_protected)
    found: dict[tuple[str, str], Finding] = {}
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
            for f in _classify(entry, protected, allowed_secrets, stack, roots):
                found.setdefault((f.path, f.action), f)
    if len(found) > MAX_MASKS:
        raise UsageError(f"{root} needs {len(found)} protected or hidden paths",
                         f"corral mounts at most {MAX_MASKS}",
                         "start the agent in a smaller project directory")
    return list(found.values())


def _classify(entry: os.DirEntry[str], protected: set[str] | frozenset[str],
              allowed_secrets: Sequence[str], stack: list[str], roots: Sequence[str]
              ) -> Iterator[Finding]:
    name, path = entry.name, entry.path
    is_link = entry.is_symlink()
    is_dir = not is_link and entry.is_dir(follow_symlinks=False)
    if name == ".git":
        yield from _dot_git(path, is_link, is_dir, roots)
        return
    secret = (is_dir and name in SECRET_DIRS) or _is_secret(name, allowed_secrets)
    if name in protected or secret:
        if is_link:
            raise _refuse(path, "is a symbolic link", "a link there reaches whatever it points "
                          "at, which corral neither protects nor hides")
        st = entry.stat(follow_symlinks=False)
        if not is_dir and st.st_nlink > 1:
            raise _refuse(path, f"has {st.st_nlink} hard links",
                          "its other names would stay writable and readable")
        kind = "dir" if is_dir else "file"
        if name in protected:
            yield Finding(path, "protect", kind, "run or trusted by tools on the host")
        else:
            yield Finding(path, "hide", kind, "looks like a secret")
        return
    if is_dir:
        stack.append(path)


def _dot_git(path: str, is_link: bool, is_dir: bool, roots: Sequence[str]
             ) -> Iterator[Finding]:
    if is_link:
        raise _refuse(path, "is a symbolic link", "git follows it to find hooks and config")
    worktree = os.path.dirname(path)
    if is_dir:
        yield from repos.git_findings(path, worktree, roots)
        return
    # A .git file ("gitdir: ..."): a worktree, a submodule, or --separate-git-dir.
    yield Finding(path, "protect", "file", "points git at a git directory")
    target = repos.gitfile_target(path)
    if target is not None and any(target == r or target.startswith(r.rstrip("/") + "/")
                                  for r in roots):
        yield from repos.git_findings(target, worktree, roots, main=False)


def verify_unchanged(root: str, findings: Sequence[Finding]) -> list[list[object]]:
    """Just before launch: every mount destination under ``root`` is reached through real
    directories only (bwrap 0.8 follows symlinks while setting up, DESIGN fact 7).

    Returns ``[path, action, dev, ino]`` for each, for corral's init to check
    from inside that the mounts landed where they should.
    """
    expected: list[list[object]] = []
    top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for f in findings:
            rel = os.path.relpath(f.path, root)
            if rel.startswith(".."):
                continue
            st = _walk_components(top, rel.split("/"), f)
            expected.append([f.path, f.action, st.st_dev, st.st_ino])
    finally:
        os.close(top)
    return expected


def _walk_components(top: int, parts: list[str], f: Finding) -> os.stat_result:
    fd = top
    try:
        for i, part in enumerate(parts):
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            last = i == len(parts) - 1
            if stat.S_ISLNK(st.st_mode) or (not last and not stat.S_ISDIR(st.st_mode)) or (
                    last and stat.S_ISDIR(st.st_mode) != (f.kind == "dir")):
                raise UsageError(f"{f.path} changed while corral was starting",
                                 "a path component is now a symlink or another kind of file",
                                 "stop whatever is changing the project and start again")
        return st
    except FileNotFoundError:
        raise UsageError(f"{f.path} disappeared while corral was starting", "",
                         "start again") from None
    finally:
        if fd != top:
            os.close(fd)
