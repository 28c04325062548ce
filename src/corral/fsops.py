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
* started by root, on a tree owned by someone else, acts with the owner's identity
  (:func:`acting_as`): the thread's filesystem uid and gid and its groups become the owner's
  for the operation.  What root creates there is the owner's from birth (no ``chown`` by path
  afterwards), and a swapped path can never turn root's ``mkdir`` or ``open`` onto a file the
  owner could not touch.

Nothing found beneath a tree is ever executed or trusted to name what gets mounted: it is data
(DESIGN, wave 2, root 1).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import threading
from collections.abc import Iterator
from types import TracebackType

__all__ = ["Tree", "acting_as", "open_beneath", "reason", "remove_tree", "split"]

# openat2(2): include/uapi/linux/openat2.h; the number is the same on every architecture.
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
# setgroups(2) as a raw system call changes only the calling thread's groups; the C
# library's wrapper would change every thread's (and the egress proxy's thread must keep
# root's).
SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
EAGAIN_RETRIES = 16  # openat2 says EAGAIN when a rename raced the lookup; try again


# What a refused operation beneath a tree means, in words a user can act on.
REASONS = {
    errno.ELOOP: "a symbolic link is on the way, and links are never followed",
    errno.EXDEV: "the path leaves the tree",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "it is a directory",
    errno.EEXIST: "something that is not a directory is in the way",
    errno.EFBIG: "it is larger than the limit",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def reason(e: OSError) -> str:
    """Why a :class:`Tree` operation failed, in one short phrase."""
    return REASONS.get(e.errno or 0, e.strerror or str(e))


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class _Kernel:
    """Whether openat2 works here, learnt on first use (a process-wide fact, like host.detect)."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.openat2: bool | None = None


_KERNEL: list[_Kernel] = []  # one per process, made on first use (nothing at import)


def _kernel() -> _Kernel:
    if not _KERNEL:
        _KERNEL.append(_Kernel())
    return _KERNEL[0]


def split(rel: str) -> list[str]:
    """The components of a relative path beneath a tree; refuses what could leave it."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts or "\0" in rel:
        raise OSError(errno.EXDEV, f"{rel!r} does not stay beneath its tree")
    return parts


def open_beneath(dirfd: int, rel: str, flags: int, mode: int = 0) -> int:
    """Open ``rel`` beneath the directory ``dirfd``, never through a symbolic link.

    ``rel`` empty (or ``.``) opens the directory itself again.  ``O_NOFOLLOW`` and
    ``O_CLOEXEC`` are always added: a symbolic link as the last component is refused too
    (``ELOOP``), except with ``O_PATH``, which opens the link itself.
    """
    parts = split(rel)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not parts:
        return os.open(".", flags, dir_fd=dirfd)
    k = _kernel()
    if k.openat2 is not False:
        fd = _openat2(k, dirfd, "/".join(parts), flags, mode)
        if fd is not None:
            return fd
    return _walk_open(dirfd, parts, flags, mode)


def _openat2(k: _Kernel, dirfd: int, rel: str, flags: int, mode: int) -> int | None:
    how = OpenHow(flags, mode if flags & os.O_CREAT else 0, RESOLVE)
    path = os.fsencode(rel)
    for _ in range(EAGAIN_RETRIES):
        fd = int(k.libc.syscall(SYS_OPENAT2, ctypes.c_int(dirfd), ctypes.c_char_p(path),
                                ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))
        if fd >= 0:
            k.openat2 = True
            return fd
        err = ctypes.get_errno()
        if err == errno.ENOSYS and k.openat2 is None:
            k.openat2 = False  # before Linux 5.6, or filtered: the component walk does it
            return None
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), rel)
    raise OSError(errno.EAGAIN, "the tree kept changing while corral opened a path", rel)


def _walk_open(dirfd: int, parts: list[str], flags: int, mode: int) -> int:
    """The same lookup without openat2: one component at a time, each a real directory."""
    fd = dirfd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            if fd != dirfd:
                os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags, mode, dir_fd=fd)
    finally:
        if fd != dirfd:
            os.close(fd)


def _setgroups(groups: list[int]) -> None:
    number = SYS_SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no thread-local setgroups known on {platform.machine()}")
    array = (ctypes.c_uint32 * max(len(groups), 1))(*groups)
    libc = _kernel().libc
    if libc.syscall(ctypes.c_long(number), ctypes.c_int(len(groups)), array) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")


def _set_fs_ids(uid: int, gid: int) -> None:
    libc = _kernel().libc
    libc.setfsgid(ctypes.c_uint32(gid))
    libc.setfsuid(ctypes.c_uint32(uid))
    # setfsuid(2) cannot report failure; asking with an invalid id returns the current one.
    now_uid = libc.setfsuid(ctypes.c_uint32(0xFFFFFFFF))
    now_gid = libc.setfsgid(ctypes.c_uint32(0xFFFFFFFF))
    if (now_uid, now_gid) != (uid, gid):
        raise OSError(errno.EPERM, f"could not act as uid {uid}, gid {gid}")


_ACTING = threading.local()


@contextlib.contextmanager
def acting_as(owner: tuple[int, int] | None) -> Iterator[None]:
    """Within the block, this thread's file operations are ``owner``'s (uid, gid).

    Only when started by root and ``owner`` is someone else; otherwise nothing changes.
    The filesystem uid and gid and the supplementary groups are per thread in Linux, so
    other threads (the egress proxy) keep root's.  Leaving the block restores root's, on
    every path; a failure to restore is fatal to the process, never ignored.
    """
    if owner is None or os.geteuid() != 0 or owner[0] == 0 or getattr(_ACTING, "on", False):
        yield
        return
    uid, gid = owner
    saved = os.getgroups()
    _setgroups([gid])
    try:
        _set_fs_ids(uid, gid)
        _ACTING.on = True
        yield
    finally:
        _ACTING.on = False
        try:
            _set_fs_ids(0, 0)
            _setgroups(saved)
        except OSError:  # a root thread stuck with a user's identity must not go on
            os.abort()


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
            # The top itself is opened by name, with the launcher's own rights (the owner
            # may not be able to reach it: a workspace in root's private runs folder):
            # callers pass a path they resolved and checked (guard.check_writable_root),
            # whose parents the payload cannot write.
            fd = os.open(root, PATH_FLAGS | os.O_DIRECTORY)
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
        """A descriptor for ``rel``; the caller closes it.  Creation is as the owner."""
        with acting_as(self.owner):
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
        if fd is None:
            return None
        try:
            data = bytearray()
            while len(data) <= cap and (chunk := os.read(fd, min(1 << 16, cap + 1 - len(data)))):
                data += chunk
            if len(data) > cap:
                raise OSError(errno.EFBIG, f"larger than {cap} bytes", self.path(rel))
            return bytes(data)
        finally:
            os.close(fd)

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
            with acting_as(self.owner):
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
        *parents, name = split(rel)
        parent = self.open("/".join(parents), os.O_PATH | os.O_DIRECTORY)
        try:
            with acting_as(self.owner):
                with contextlib.suppress(FileExistsError):
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
        *parents, name = split(rel)
        parent = self.open("/".join(parents), os.O_PATH | os.O_DIRECTORY)
        try:
            with acting_as(self.owner):
                os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def rename(self, rel: str, dest: Tree, dest_rel: str) -> None:
        """Move ``rel`` to ``dest_rel`` beneath ``dest`` (which may be this tree)."""
        *src_parents, src_name = split(rel)
        *dst_parents, dst_name = split(dest_rel)
        src = self.open("/".join(src_parents), os.O_PATH | os.O_DIRECTORY)
        try:
            dst = dest.open("/".join(dst_parents), os.O_PATH | os.O_DIRECTORY)
            try:
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
        with contextlib.suppress(FileNotFoundError):
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
    with contextlib.suppress(OSError):
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
        with contextlib.suppress(OSError):
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
                    with contextlib.suppress(OSError):
                        os.rmdir(here, dir_fd=stack[-1][0])
                continue
            if _unlinked(fd, name):
                continue
            if len(stack) >= REMOVE_DEPTH:
                fresh = f".corral-deep-{os.urandom(6).hex()}"
                with contextlib.suppress(OSError):
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
            with contextlib.suppress(OSError):
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
