"""Host-side file operations beneath trees a payload can write: the only module that opens,
creates, reads or changes anything there.

A payload-writable tree (a project, a reused workspace, an agent's state folder) can change
under corral's feet while corral looks at it: a directory swapped for a symbolic link with
``renameat2(RENAME_EXCHANGE)``, a FIFO where a file was, a file grown to gigabytes.  So every
operation here:

* starts from the tree's own directory descriptor (:class:`Tree`), opened once, and resolves
  the rest with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``,
  or, on kernels without ``openat2`` (before 5.6), component by component with ``O_NOFOLLOW``;
  a symbolic link anywhere on the way, ``..``, or an absolute path is refused (``ELOOP`` or
  ``EXDEV``), never followed;
* opens files ``O_NONBLOCK | O_NOCTTY`` and checks the type with ``fstat`` after opening, so
  a FIFO never blocks and a device never becomes a terminal; reads are capped;
* creates through the parent's descriptor and inspects through the new object's own;
* started by root, on a tree owned by someone else, creates, writes, removes and renames
  with the owner's identity (:func:`acting_as`): the thread's filesystem uid and gid and
  its groups become the owner's for the operation (looking and reading keep root's: what
  the owner locked away with chmod it could also unlock, so corral must see it).  What
  root creates there is the owner's from birth (no ``chown`` by path afterwards), and a
  swapped path can never turn root's ``mkdir`` or ``open`` onto a file the owner could not
  touch.

Nothing found beneath a tree is ever executed or trusted to name what gets mounted: it is data
(DESIGN, wave 2, root 1).
"""

from __future__ import annotations

import errno
import os
import stat
from types import TracebackType

from . import small

# The openat2 walk and the owner's identity, which every Tree operation rests on.
from .beneath import (
    DIR_FLAGS,
    PATH_FLAGS,
    _read_capped,
    acting_as,
    kind_of,
    open_beneath,
    open_no_links,
    read_file,
    reason,
    split,
)
from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["HOST_FILE_CAP", "Entry", "Tree", "acting_as", "hold", "kind_of", "open_beneath",
           "open_dir", "open_held", "open_host_file", "open_no_links", "read_file", "reason",
           "release", "remove_tree", "split", "stat_held"]

# The trees this process holds (corral.workspace.held and claimed), by every path that
# named them when they were locked: path -> the descriptors that hold it.  A tree held is
# reached through its descriptor from then on, never by name again: the folders above it
# may be another user's to rename (review 42: started by root for a user's project, that
# user swapped the folder above the locked workspace for a link, and the owner's stat,
# the bind and the audit followed it into a third user's home).
_HELD: dict[str, list[int]] = {}


def hold(paths: list[str], fd: int) -> list[str]:
    """Register ``fd`` (a directory descriptor the caller keeps open) as the way to each of
    ``paths`` and everything beneath them; return the keys, for :func:`release`."""
    keys = list(dict.fromkeys(os.path.normpath(p) for p in paths))
    for key in keys:
        _HELD.setdefault(key, []).append(fd)
    return keys


def release(keys: list[str], fd: int) -> None:
    for key in keys:
        fds = _HELD.get(key)
        if fds is not None and fd in fds:
            fds.remove(fd)
            if not fds:
                del _HELD[key]


def open_held(path: str, flags: int) -> int | None:
    """``path`` opened with ``flags`` through the descriptor of the held tree it is in (the
    rest beneath it, no link followed), or None when it is in no tree this process holds."""
    if not _HELD:
        return None
    norm = at = os.path.normpath(path)
    while True:
        fds = _HELD.get(at)
        if fds:
            rest = os.path.relpath(norm, at)
            return open_beneath(fds[-1], "" if rest == "." else rest, flags)
        if at in ("/", ""):
            return None
        at = os.path.dirname(at)


def stat_held(path: str) -> os.stat_result:
    """``path``'s own status: through the held tree it is in (:func:`open_held`), else by
    name.  What decides whose a held folder is (the identity a payload gets)."""
    fd = open_held(path, os.O_PATH | os.O_DIRECTORY)
    if fd is None:
        return os.stat(path)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def open_dir(path: str, flags: int) -> int:
    """The directory ``path``: through a held tree (:func:`open_held`), else by name."""
    fd = open_held(path, flags)
    return os.open(path, flags) if fd is None else fd


class Entry(NamedTuple):
    """One name in a directory and what it is (a link is a link, never its target)."""

    name: str
    kind: str  # see kind_of
    st: os.stat_result | None = None  # its lstat, when asked for (Tree.scandir(stats=True))


class Tree:
    """A payload-writable directory tree, held by a descriptor; see the module docstring.

    ``owner`` (uid, gid) is whose identity root acts with beneath it; None for the
    launcher's own.  Use as a context manager, or :meth:`close` it.
    """

    def __init__(self, root: str, owner: tuple[int, int] | None = None,
                 fd: int | None = None) -> None:
        self.root = root
        self.owner = owner
        if fd is None:
            # The top itself is opened with the launcher's own rights (the owner may not
            # be able to reach it: a workspace in root's private runs folder): through the
            # held tree it is in, else by name (callers pass a path they resolved and
            # checked, guard.check_writable_root, whose parents the payload cannot write).
            fd = open_dir(root, PATH_FLAGS | os.O_DIRECTORY)
        self.fd = fd

    def subtree(self, rel: str) -> Tree:
        """The directory ``rel`` as a tree of its own, reached beneath this one."""
        return Tree(self.path(rel), self.owner, self.open(rel, os.O_PATH | os.O_DIRECTORY))

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def path(self, rel: str) -> str:
        """The host path of ``rel``, for messages only: never open it by this name."""
        return os.path.join(self.root, *split(rel))

    def open(self, rel: str, flags: int, mode: int = 0o600) -> int:
        """A descriptor for ``rel``; the caller closes it.  Opening to create or write is
        as the owner; looking and reading keep the launcher's rights (root then sees what
        the owner hid from itself with chmod, and could undo: the scan must see it too)."""
        writing = flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR | os.O_TRUNC)
        with acting_as(self.owner if writing else None):
            return open_beneath(self.fd, rel, flags, mode)

    def lstat(self, rel: str) -> os.stat_result | None:
        """``rel`` itself (a link is not followed), or None when it does not exist.

        A symbolic link on the way is an error (``ELOOP``), not a missing file: the
        caller must not take "absent" for an answer when the tree is being tampered with.
        """
        try:
            fd = self.open(rel, os.O_PATH)
        except FileNotFoundError:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def read(self, rel: str, cap: int) -> bytes | None:
        """The contents of the regular file ``rel``; None when it is absent or not a
        regular file (a FIFO, a socket, a device, a directory: none of them is ever opened
        for reading).  Over ``cap`` bytes: ``EFBIG``."""
        fd = self._regular(rel, os.O_RDONLY)
        return None if fd is None else _read_capped(fd, cap, self.path(rel))

    def open_regular(self, rel: str) -> int | None:
        """``rel`` opened for reading if it is a regular file (see :meth:`read`), else None;
        the caller closes it.  For a file read in parts (a git object, hashed as a stream)."""
        return self._regular(rel, os.O_RDONLY)

    def _regular(self, rel: str, flags: int) -> int | None:
        """``rel`` opened with ``flags`` if it is a regular file, else None.

        Looked up with ``O_PATH`` and checked before it is opened for real, through the
        descriptor (``/proc/self/fd``): the very inode that was checked, so nothing swapped
        in between is opened, and opening never blocks or has a device's side effects.
        """
        try:
            handle = self.open(rel, os.O_PATH)
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                return None
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC)
            with acting_as(self.owner if writing else None):
                return os.open(f"/proc/self/fd/{handle}",
                               flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        finally:
            os.close(handle)

    def listdir(self, rel: str = "") -> list[str]:
        """The names in directory ``rel``."""
        fd = self.open(rel, DIR_FLAGS)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def mkdir(self, rel: str, mode: int = 0o755) -> os.stat_result:
        """Create directory ``rel`` as the owner, through its parent's descriptor.

        An existing directory is accepted (another launch may have just made it); a symbolic
        link in its place is ``ELOOP`` (never followed), anything else ``EEXIST``.  Returns
        the directory's own stat.
        """
        parent, name = self.parent(rel)
        try:
            with acting_as(self.owner):
                with small.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=parent)
                fd = open_beneath(parent, name, os.O_PATH | os.O_DIRECTORY)
        except NotADirectoryError:
            there = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            raise OSError(errno.ELOOP if stat.S_ISLNK(there) else errno.EEXIST,
                          "exists and is not a directory", self.path(rel)) from None
        finally:
            os.close(parent)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def makedirs(self, rel: str, mode: int = 0o755) -> os.stat_result:
        """Create ``rel`` and its missing parents as the owner; returns the last one's stat."""
        parts = split(rel)
        st = os.fstat(self.fd)
        for i in range(len(parts)):
            st = self.mkdir("/".join(parts[:i + 1]), mode)
        return st

    def write(self, rel: str, data: bytes, mode: int = 0o600) -> None:
        """Replace the file ``rel`` with ``data``, as the owner, atomically.

        Written to a fresh name beside it (``O_EXCL``: never an existing file or a link's
        target), then renamed over ``rel`` through the parent's descriptor: whatever was
        at ``rel`` (a link included) is replaced, never followed.
        """
        *parents, name = split(rel)
        parent = self.open("/".join(parents), os.O_PATH | os.O_DIRECTORY)
        temp = f".corral-{os.urandom(6).hex()}"
        try:
            with acting_as(self.owner):
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, mode, dir_fd=parent)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
                try:
                    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
                except OSError:
                    os.unlink(temp, dir_fd=parent)
                    raise
        finally:
            os.close(parent)

    def unlink(self, rel: str) -> None:
        """Remove the non-directory ``rel`` (a link itself, never its target)."""
        parent, name = self.parent(rel)
        try:
            with acting_as(self.owner):
                os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def rename(self, rel: str, dest: Tree, dest_rel: str) -> None:
        """Move ``rel`` to ``dest_rel`` beneath ``dest`` (which may be this tree): as the
        owner within one tree; into another (the audit's quarantine, the launcher's own)
        with the launcher's rights, which the owner lacks there."""
        src, src_name = self.parent(rel)
        try:
            dst, dst_name = dest.parent(dest_rel)
            try:
                with acting_as(self.owner if dest is self else None):
                    os.rename(src_name, dst_name, src_dir_fd=src, dst_dir_fd=dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)

    def chmod(self, rel: str, clear: int) -> os.stat_result | None:
        """Clear the mode bits ``clear`` of ``rel`` (never through a link), through its own
        descriptor; None when it is absent or a symbolic link.  Returns its new stat."""
        try:
            handle = self.open(rel, os.O_PATH)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(handle)
            if stat.S_ISLNK(st.st_mode):
                return None
            with acting_as(self.owner):
                os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(st.st_mode) & ~clear)
            return os.fstat(handle)
        finally:
            os.close(handle)

    def grant(self, rel: str, bits: int) -> None:
        """Add the mode bits ``bits`` to the directory ``rel`` (never through a link), as
        the owner: a folder the payload locked (``chmod 111``) is its owner's to open."""
        handle = self.open(rel, os.O_PATH | os.O_DIRECTORY)
        try:
            st = os.fstat(handle)
            with acting_as(self.owner):
                os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(st.st_mode) | bits)
        finally:
            os.close(handle)

    # -- more than one name at a time --------------------------------------------------

    def parent(self, rel: str) -> tuple[int, str]:
        """An ``O_PATH`` descriptor of ``rel``'s directory (the caller closes it), and its
        last name: for the ``*at`` calls, which never follow a last-component link."""
        *parents, name = split(rel)
        if not name:
            raise OSError(errno.EINVAL, "the top of a tree has no parent here", self.root)
        return self.open("/".join(parents), os.O_PATH | os.O_DIRECTORY), name

    def scandir(self, rel: str = "", stats: bool = False) -> list[Entry]:
        """The entries of directory ``rel`` with their kinds, links not followed; with
        ``stats``, each one's lstat too (relative to the directory's own descriptor)."""
        fd = self.open(rel, DIR_FLAGS)
        try:
            with os.scandir(fd) as it:
                return [Entry(e.name, _entry_kind(e), _entry_stat(e) if stats else None)
                        for e in it]
        finally:
            os.close(fd)

    def scandir_chunks(self, rel: str = "", stats: bool = False, size: int = 4096
                       ) -> Iterator[list[Entry]]:
        """:meth:`scandir` a ``size`` entries at a time, so that a directory of a million
        names costs one chunk of memory, not a million entries at once."""
        fd = self.open(rel, DIR_FLAGS)
        try:
            with os.scandir(fd) as it:
                chunk: list[Entry] = []
                for e in it:
                    chunk.append(Entry(e.name, _entry_kind(e), _entry_stat(e) if stats else None))
                    if len(chunk) >= size:
                        yield chunk
                        chunk = []
                if chunk:
                    yield chunk
        finally:
            os.close(fd)

    def components(self, rel: str) -> list[os.stat_result]:
        """The stat of the top and of every component down to ``rel``, each reached
        beneath the one before without following a link (the last may be a link)."""
        out, fd = [os.fstat(self.fd)], self.fd
        try:
            for part in split(rel):
                nxt = open_beneath(fd, part, os.O_PATH)
                if fd != self.fd:
                    os.close(fd)
                fd = nxt
                out.append(os.fstat(fd))
            return out
        finally:
            if fd != self.fd:
                os.close(fd)

    def readlink(self, rel: str) -> str:
        """What the symbolic link ``rel`` says (never followed)."""
        parent, name = self.parent(rel)
        try:
            return os.readlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def write_new(self, rel: str, data: bytes, mode: int = 0o644) -> os.stat_result:
        """Create the file ``rel`` (it must not exist) as the owner, holding ``data``."""
        fd = self.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return os.fstat(fd)
        finally:
            os.close(fd)

    def symlink(self, target: str, rel: str) -> None:
        """Create the link ``rel`` -> ``target`` as the owner (``target`` is only text)."""
        parent, name = self.parent(rel)
        try:
            with acting_as(self.owner):
                os.symlink(target, name, dir_fd=parent)
        finally:
            os.close(parent)

    def rmdir(self, rel: str) -> None:
        """Remove the empty directory ``rel`` (never a link's target)."""
        parent, name = self.parent(rel)
        try:
            with acting_as(self.owner):
                os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)


def _entry_stat(e: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return e.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None


def _entry_kind(e: os.DirEntry[str]) -> str:
    if e.is_symlink():
        return "link"
    if e.is_dir(follow_symlinks=False):
        return "dir"
    if e.is_file(follow_symlinks=False):
        return "file"
    try:
        return kind_of(e.stat(follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return "other"


REMOVE_DEPTH = 64  # directories open at once while removing; deeper ones are moved up first


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything beneath it, never following a symbolic link.

    For a tree whose payload is gone (a finished run's directory): its parent must be the
    launcher's own.  Descriptors, not names, lead the walk; a directory the payload made
    unreadable or unwritable is given back its owner's rights (it is the owner's: the
    payload ran as them) before it is emptied; a tree deeper than REMOVE_DEPTH is
    flattened, its deep directories moved up to the top under fresh names, so the walk
    never holds more than REMOVE_DEPTH descriptors.  Whatever cannot be removed stays.
    """
    parent, name = os.path.split(os.path.abspath(path))
    pfd = os.open(parent, DIR_FLAGS)
    try:
        with small.suppress(FileNotFoundError):
            _remove_entry(pfd, name)
    finally:
        os.close(pfd)


def _remove_entry(parent: int, name: str) -> None:
    if _unlinked(parent, name):
        return
    top = _open_dir(parent, name)
    try:
        _empty(top)
    finally:
        os.close(top)
    with small.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


def _open_dir(parent: int, name: str) -> int:
    """Directory ``name`` of ``parent``, readable and writable by us (its owner or root)."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        handle = os.open(name, PATH_FLAGS | os.O_DIRECTORY, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    st = os.fstat(fd)
    if st.st_mode & 0o700 != 0o700 and os.geteuid() != 0:
        with small.suppress(OSError):
            os.fchmod(fd, 0o700)
    return fd


def _empty(top: int) -> None:
    """Remove everything beneath the directory ``top``, depth first, by descriptors."""
    # Each frame: a directory's descriptor, the names left in it, its name in its parent.
    stack: list[tuple[int, Iterator[str], str]] = [(top, iter(os.listdir(top)), "")]
    try:
        while stack:
            fd, names, here = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                if stack:  # an emptied subdirectory: close it, remove it from its parent
                    os.close(fd)
                    with small.suppress(OSError):
                        os.rmdir(here, dir_fd=stack[-1][0])
                continue
            if _unlinked(fd, name):
                continue
            if len(stack) >= REMOVE_DEPTH:
                fresh = f".corral-deep-{os.urandom(6).hex()}"
                with small.suppress(OSError):
                    os.rename(name, fresh, src_dir_fd=fd, dst_dir_fd=top)
                    stack[0] = (top, _chain([fresh], stack[0][1]), "")
                continue
            try:
                sub = _open_dir(fd, name)
            except OSError:
                continue  # neither removable nor a directory we may enter: it stays
            stack.append((sub, iter(os.listdir(sub)), name))
    finally:
        for fd, _, _ in stack[1:]:
            with small.suppress(OSError):
                os.close(fd)


def _unlinked(dirfd: int, name: str) -> bool:
    """Whether ``name`` is gone: unlinked now, or missing already; False for a directory."""
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        return True
    except (IsADirectoryError, PermissionError):
        return False  # a directory: Linux says EISDIR, or EPERM
    return True


def _chain(first: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from first
    yield from rest


HOST_FILE_CAP = 1 << 20  # a system file copied into a sandbox (corral.bwrap.HostFile)


def open_host_file(path: str) -> int:
    """A root-owned, world-readable regular host file of at most HOST_FILE_CAP bytes,
    opened for bwrap to copy (``/etc/services``); OSError(EPERM) for anything else.

    Not under a payload-writable tree: only root can change it, so links are followed as a
    bind would follow them.  Checked again here, through the descriptor, because the
    resolver's look may be old: a copy must never show what the bind would not.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if (stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_mode & 0o004
            and st.st_size <= HOST_FILE_CAP):
        return fd
    os.close(fd)
    raise OSError(errno.EPERM, "no longer a small, root-owned, world-readable file")
