"""Walks, removals and moves beneath payload-writable trees, made of :class:`fsops.Tree`'s
single-name operations only (no system call of its own): so they inherit its guarantees,
never following a link, never blocking, acting as the tree's owner when root.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat

from . import small
from .fsops import Entry, Tree, kind_of

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import TypeVar

    T = TypeVar("T")
_NONE = os.stat_result((0,) * 10)  # lstat of a name that is gone: not a directory

__all__ = ["COPY_CAP", "move", "remove", "walk"]

COPY_CAP = 256 << 20  # bytes one move across file systems may copy (then it refuses)


def walk(tree: Tree, rel: str = "", limit: int = 1 << 20, stats: bool = False,
         chunk: int = 0, errors: list[OSError] | None = None, unlock: bool = True
         ) -> Iterator[tuple[str, list[Entry]]]:
    """Top-down, like ``os.walk``: (directory, its entries) for ``rel`` and every directory
    beneath.  Remove a directory from the yielded list to stay out of it.  A directory gone
    meanwhile is skipped; one replaced by a link is ``ELOOP``; past ``limit`` entries in
    all, ``E2BIG``.  ``stats``: see :meth:`Tree.scandir`.

    With ``chunk``, a directory comes in consecutive parts of at most that many entries
    (the same directory name each time): the caller's memory stays one part, whatever the
    payload made, but a check that needs the whole listing must not use it.

    With ``errors`` (the audit's way), a directory the payload locked is given its owner's
    rights back and listed; one that still cannot be listed is appended to ``errors`` and
    the walk goes on with the rest: one locked folder must not hide every other one.
    ``unlock=False``: no rights are given back (the launch's census: the user's folders
    are theirs to keep locked), such a folder is only appended to ``errors``."""
    stack, count = [rel], 0
    while stack:
        here = stack.pop()
        try:
            for entries in _parts(tree, here, stats, chunk, errors is not None and unlock):
                count += len(entries)
                if count > limit:
                    raise OSError(errno.E2BIG, f"more than {limit} entries", tree.path(rel))
                yield here, entries
                stack += [join(here, e.name) for e in entries if e.kind == "dir"]
        except FileNotFoundError:
            continue
        except OSError as e:
            if errors is None or e.errno == errno.E2BIG:
                raise
            # The folder, whatever failed in it (the lstat of one entry names only the
            # entry: review 29's folder that could be listed but not entered was taken for
            # the user's own folder of that name at the tree's top).
            e.filename = tree.path(here)
            errors.append(e)


def _parts(tree: Tree, here: str, stats: bool, chunk: int, unlock: bool
           ) -> Iterator[list[Entry]]:
    """The listing of ``here`` in parts, the directory opened before the first is yielded
    (so that a refusal comes here, where a locked folder gets its owner's rights back)."""
    try:
        return _opened(tree, here, stats, chunk)
    except PermissionError:
        if not unlock:
            raise
    tree.grant(here, 0o700)
    return _opened(tree, here, stats, chunk)


def _opened(tree: Tree, here: str, stats: bool, chunk: int) -> Iterator[list[Entry]]:
    if not chunk:
        return iter([tree.scandir(here, stats)])
    parts = tree.scandir_chunks(here, stats, chunk)
    first = next(parts, None)  # opens the directory now
    return itertools.chain([] if first is None else [first], parts)


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _unlocked(tree: Tree, op: Callable[[], T], *folders: str) -> T:
    """``op()``; refused (a folder the payload locked: ``chmod 555 .git``), the owner's
    rights back on each of ``folders`` (the tree's owner's own, as the walk does to list
    them), and ``op()`` once more."""
    try:
        return op()
    except PermissionError:
        for folder in folders:
            tree.grant(folder, 0o700)
        return op()


def remove(tree: Tree, rel: str, budget: list[int] | None = None) -> None:
    """Remove ``rel`` and, if a directory, all beneath it (links themselves only), the
    owner's rights given back to a folder the payload locked on the way.  ``budget`` (one
    number, shared) caps the entries removed: ``E2BIG`` past it.  Iterative: a tree as deep
    as the payload likes costs no recursion (a folder 1,200 levels deep stopped the old
    recursive removal, and with it the live watch; found by review)."""
    budget = budget if budget is not None else [1 << 20]
    stack: list[tuple[str, bool]] = [(rel, False)]  # (path, its entries already stacked)
    while stack:
        here, emptied = stack.pop()
        if emptied:
            _unlocked(tree, lambda h=here: tree.rmdir(h), _parent(here))  # type: ignore[misc]
            continue
        st = tree.lstat(here)
        if st is None:
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise OSError(errno.E2BIG, "too many entries to remove", tree.path(rel))
        if not stat.S_ISDIR(st.st_mode):
            _unlocked(tree, lambda h=here: tree.unlink(h), _parent(here))  # type: ignore[misc]
            continue
        stack.append((here, True))
        entries = _unlocked(tree, lambda h=here: tree.scandir(h), here)  # type: ignore[misc]
        stack += [(join(here, e.name), False) for e in entries]


def move(tree: Tree, rel: str, dest: Tree, dest_rel: str) -> None:
    """Move ``rel`` to ``dest_rel`` beneath ``dest``: a rename (the owner's rights given
    back to the folder it leaves, and to itself if a folder, when the payload locked
    them), or across file systems a bounded copy (files, directories, links; ``COPY_CAP``
    bytes) and then a removal.  A FIFO, socket or device is not copied: ``EXDEV`` then,
    and nothing changes."""
    folders = (_parent(rel), rel) if stat.S_ISDIR((tree.lstat(rel) or _NONE).st_mode) \
        else (_parent(rel),)
    try:
        _unlocked(tree, lambda: tree.rename(rel, dest, dest_rel), *folders)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    try:
        _copy(tree, rel, dest, dest_rel, [COPY_CAP])
    except OSError:
        with small.suppress(OSError):
            remove(dest, dest_rel)
        raise
    remove(tree, rel)


def _copy(tree: Tree, rel: str, dest: Tree, dest_rel: str, budget: list[int]) -> None:
    """Copy ``rel`` to ``dest_rel``, iteratively (see :func:`remove`)."""
    stack = [(rel, dest_rel)]
    while stack:
        here, there = stack.pop()
        st = tree.lstat(here)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, "gone", tree.path(here))
        budget[0] -= max(st.st_size, 1) if stat.S_ISREG(st.st_mode) else 1
        if budget[0] < 0:
            raise OSError(errno.EFBIG, "too large to copy", tree.path(rel))
        if stat.S_ISLNK(st.st_mode):
            dest.symlink(tree.readlink(here), there)
        elif stat.S_ISDIR(st.st_mode):
            dest.mkdir(there, 0o700)
            stack += [(join(here, e.name), join(there, e.name)) for e in tree.scandir(here)]
        elif stat.S_ISREG(st.st_mode):
            data = tree.read(here, st.st_size + max(budget[0], 0))
            dest.write_new(there, data or b"", stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
        else:
            raise OSError(errno.EXDEV, f"a {kind_of(st.st_mode)} cannot be copied",
                          tree.path(here))
