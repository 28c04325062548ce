"""Where a path that git (or another host program) will follow really lands, and which
writable tree holds it.

A hook entry that is a link, an include path with ``..`` in it, a ``core.hooksPath``:
the kernel resolves them component by component, links included, and so does
:func:`land`.  A link on the way *outside* every writable tree is the host's own and is
followed; a link *inside* one could be pointed elsewhere by the payload at any time, so
it is refused (:class:`~corral.errors.UsageError`): corral could not keep what it points
at in place.  Inside a writable tree every look goes through :class:`fsops.Tree`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from . import fsops
from .errors import UsageError
from .record import NamedTuple

__all__ = ["Landing", "Roots", "land"]

MAX_HOPS = 40  # the kernel's own limit on links in one lookup


class Roots:
    """The writable trees of one sandbox, each held by a descriptor; close when done."""

    def __init__(self, trees: Sequence[fsops.Tree]) -> None:
        self.trees = sorted(trees, key=lambda t: -len(t.root))  # the deepest holds a path

    def find(self, path: str) -> tuple[fsops.Tree, str] | None:
        """The writable tree holding ``path`` (lexically, no links in it), and the rest."""
        for t in self.trees:
            if path == t.root or path.startswith(t.root.rstrip("/") + "/"):
                return t, os.path.relpath(path, t.root) if path != t.root else ""
        return None

    def close(self) -> None:
        for t in self.trees:
            t.close()


class Landing(NamedTuple):
    """Where a path lands: its physical path, the writable tree holding it (None: none)."""

    path: str
    tree: fsops.Tree | None
    rel: str
    st: os.stat_result | None  # None: nothing there (yet)
    made: bool = False  # created by this call (create=...)


def _refuse(path: str, why: str) -> UsageError:
    return UsageError(f"{path} is a symbolic link inside a writable tree, on the way to "
                      f"something {why}", "the agent could point it anywhere at any time",
                      "replace the link with the directory or file it points at")


def _lstat(path: str, roots: Roots) -> os.stat_result | None:
    held = roots.find(path)
    try:
        return held[0].lstat(held[1]) if held is not None else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        if held is not None:
            raise
        return None  # outside the trees, beyond whose rights it is read with: as absent


def land(path: str, roots: Roots, why: str, create: str | None = None) -> Landing:
    """Resolve the absolute ``path`` as the kernel would.  ``why`` says what the path is
    for, in the refusal.  ``create`` ("dir" or "file"): when it lands inside a writable
    tree and is missing, make it there, with any missing directories on the way, as the
    tree's owner (a file is an empty placeholder); nothing is made outside them."""
    todo = [p for p in path.split("/") if p]
    here, hops = "/", 0
    while todo:
        part = todo.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            here = os.path.dirname(here)
            continue
        nxt = os.path.join(here, part)
        st = _lstat(nxt, roots)
        if st is None:
            return _missing(nxt, todo, roots, create)
        if stat.S_ISLNK(st.st_mode):
            if roots.find(nxt) is not None:
                raise _refuse(nxt, why)
            hops += 1
            if hops > MAX_HOPS:
                raise UsageError(f"{path} goes through too many symbolic links", "", "fix it")
            target = os.readlink(nxt)
            todo = [p for p in target.split("/") if p] + todo
            here = "/" if target.startswith("/") else here
            continue
        here = nxt
    return _landing(here, roots, _lstat(here, roots))


def _landing(path: str, roots: Roots, st: os.stat_result | None, made: bool = False
             ) -> Landing:
    held = roots.find(path)
    return Landing(path, held[0], held[1], st, made) if held else Landing(path, None, "", st)


def _missing(nxt: str, todo: list[str], roots: Roots, create: str | None) -> Landing:
    """The rest of the path does not exist: where it would be, made if asked."""
    rest = os.path.normpath(os.path.join(nxt, *todo)) if todo else nxt
    held = roots.find(rest)
    if held is None or create is None or ".." in todo:
        return _landing(rest, roots, None)
    tree, rel = held
    parent = os.path.dirname(rel)
    if parent:
        tree.makedirs(parent)
    st = tree.mkdir(rel) if create == "dir" else tree.write_new(rel, b"")
    return Landing(rest, tree, rel, st, made=True)
