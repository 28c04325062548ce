"""Git repositories inside writable trees: what git obeys stays out of the agent's reach.

An agent must be able to commit, so a repository's git directory stays
writable, but git *runs* or *obeys* some of what is in it, later, on the host,
outside any sandbox.  For every git directory found (``.git`` folders, the
target of a ``.git`` file, submodule and worktree git directories):

* the git directory is bound onto itself ("pinned"), so that it cannot be
  renamed away and replaced;
* ``config``, ``config.worktree``, ``hooks`` (created if missing), ``info``,
  and the hook folder and included files its config names, are read-only;
* ``modules`` and ``worktrees`` are read-only (created empty if missing), so no
  new submodule or worktree git directory, with a config of its own, can
  appear; existing ones are pinned writable with their own control files
  read-only;
* ``commondir`` (which would redirect git to another config and hooks) is
  refused in a main git directory before launch, and :func:`audit` removes
  one created during the run, since a mount cannot cover what does not exist;
* a control file with more than one hard link is refused: the other name
  would stay writable.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence

from .errors import UsageError
from .guard import Finding

__all__ = ["audit", "git_findings", "gitfile_target"]

CONTROL = ("config", "config.worktree", "hooks", "info")  # read-only in every git directory
CREATED = ("hooks", "modules", "worktrees")  # made to exist, so that they can be read-only
_SECTION = re.compile(r"\s*\[\s*([A-Za-z0-9.-]+)(?:\s+\"[^\"]*\")?\s*\]")
_KEY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")


def _refuse(path: str, what: str, why: str) -> UsageError:
    return UsageError(f"{path} {what}, so corral cannot keep it out of the agent's reach", why,
                      "inspect it (a previous sandboxed session may have planted it), fix it, "
                      "and start again")


def _ensure_dir(path: str, owner: os.stat_result) -> None:
    """Create ``path`` for ``owner``; another launch in the same project may just have."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return  # the caller's lstat checks what it is
    if os.geteuid() == 0:
        os.chown(path, owner.st_uid, owner.st_gid)


def _control(gitdir: str, name: str, reason: str) -> Finding | None:
    """A read-only finding for ``gitdir/name``; refuses links; None when it is absent."""
    path = os.path.join(gitdir, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if name not in CREATED:
            return None
        _ensure_dir(path, os.stat(gitdir))
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link", "git follows it to its hooks and config")
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise _refuse(path, f"has {st.st_nlink} hard links",
                      "its other names would stay writable")
    return Finding(path, "protect", "dir" if stat.S_ISDIR(st.st_mode) else "file", reason)


def git_findings(gitdir: str, worktree: str, roots: Sequence[str], main: bool = True
                 ) -> Iterator[Finding]:
    """Everything to re-mount for the git directory ``gitdir`` of the work tree ``worktree``.

    ``roots`` are the writable trees: a path git's config names outside them is
    read-only anyway.  ``main`` is false for submodule and worktree git
    directories, whose ``commondir`` is legitimate (and then read-only).
    """
    yield Finding(gitdir, "pin", "dir", "git directory: cannot be renamed or replaced")
    if main and os.path.lexists(os.path.join(gitdir, "commondir")):
        raise _refuse(os.path.join(gitdir, "commondir"), "exists in a main git directory",
                      "git would take its config and hooks from wherever it points")
    names = (*CONTROL, "modules", "worktrees") + (() if main else ("commondir", "gitdir"))
    for name in names:
        found = _control(gitdir, name, "git runs or obeys it on the host")
        if found is not None:
            yield found
    for sub in ("modules", "worktrees"):
        yield from _nested(os.path.join(gitdir, sub), roots)
    yield from _named_by_config(os.path.join(gitdir, "config"), gitdir, worktree, roots)


def _nested(folder: str, roots: Sequence[str]) -> Iterator[Finding]:
    """Existing submodule and worktree git directories: writable, their control read-only."""
    for root, dirs, files in os.walk(folder):
        if "HEAD" in files and ("config" in files or "commondir" in files):
            dirs.clear()
            yield from git_findings(root, root, roots, main=False)


def _config_paths(config: str) -> Iterator[tuple[str, str]]:
    """(key, value) of ``core.hooksPath`` and every ``include``/``includeIf`` path."""
    try:
        with open(config, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return
    section = ""
    for line in lines:
        head = _SECTION.match(line)
        if head is not None:
            section = head.group(1).lower()
            continue
        pair = _KEY.match(line)
        if pair is None:
            continue
        key, value = pair.group(1).lower(), pair.group(2).strip('"')
        if (section, key) == ("core", "hookspath") or (
                section in ("include", "includeif") and key == "path"):
            yield key, value


def _named_by_config(config: str, gitdir: str, worktree: str, roots: Sequence[str]
                     ) -> Iterator[Finding]:
    """The hook folder and included files a config names, when they lie in a writable tree."""
    for key, value in _config_paths(config):
        if value.startswith("~/") or value.startswith("$"):
            continue  # in the home directory, which is read-only unless listed
        base = worktree if key == "hookspath" else gitdir  # how git resolves each
        path = os.path.normpath(os.path.join(base, value))
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
            continue
        if not os.path.lexists(path) and key == "hookspath":
            _ensure_dir(path, os.stat(gitdir))
        if os.path.lexists(path):
            if os.path.islink(path):
                raise _refuse(path, "is a symbolic link", f"the git config names it ({key})")
            kind = "dir" if os.path.isdir(path) else "file"
            yield Finding(path, "protect", kind, f"named by the git config ({key})")


def gitfile_target(path: str) -> str | None:
    """The git directory a ``.git`` file points at ("gitdir: ..."), resolved; None if none."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode(errors="replace")
    except OSError:
        return None
    if not head.startswith("gitdir:"):
        return None
    target = head[len("gitdir:"):].strip()
    return os.path.realpath(os.path.join(os.path.dirname(path), target))


def audit(findings: Sequence[Finding]) -> list[str]:
    """After a run: remove a ``commondir`` the run created in a main git directory.

    Returns one line per removal, for the user.
    """
    notes = []
    for f in findings:
        if f.action != "pin":
            continue
        commondir = os.path.join(f.path, "commondir")
        protected = any(g.path == commondir for g in findings)
        if protected or not os.path.lexists(commondir):
            continue
        try:
            os.unlink(commondir)
        except OSError as e:
            notes.append(f"{commondir} appeared during the run and could not be removed "
                         f"({e.strerror}): do not run git in {os.path.dirname(f.path)} "
                         "before removing it")
            continue
        notes.append(f"removed {commondir}, created during the run: it would have pointed git "
                     "at another config and hooks")
    return notes
