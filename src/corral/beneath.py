"""The lowest layer of :mod:`corral.fsops`: opening beneath a directory without ever
following a link, acting with another user's file-system identity, reading a host file
that must not block.  :mod:`corral.fsops` builds its :class:`~corral.fsops.Tree` on these
and re-exports them; nothing else should call them directly.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from . import small

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["DIR_FLAGS", "PATH_FLAGS", "acting_as", "kind_of", "open_beneath", "open_no_links",
           "read_file", "reason", "split"]

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
KINDS = ((stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "link"),
         (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"),
         (stat.S_ISBLK, "device"))


def kind_of(mode: int) -> str:
    """dir, file, link, fifo, socket, device or other: what ``mode`` says an inode is."""
    return next((name for test, name in KINDS if test(mode)), "other")


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


def open_no_links(path: str, flags: int) -> int:
    """The absolute ``path`` opened from ``/`` without following a link in any component:
    a link swapped in fails (``ELOOP``), never leads elsewhere."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_beneath(root, path.lstrip("/"), flags)
    finally:
        os.close(root)


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


def read_file(path: str, cap: int, whole: bool = True, follow: bool = True) -> bytes | None:
    """A host file outside every writable tree (a global git config, a program's first
    line): its links are the host's own and are followed (the last one too unless
    ``follow`` is false), but a FIFO or device is never opened for reading and no more
    than ``cap`` bytes are read.  None: absent, or not a regular file.  Over ``cap``:
    ``EFBIG``, or with ``whole`` false its first ``cap``."""
    try:
        handle = os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC)
    finally:
        os.close(handle)
    if not whole:
        try:
            return os.read(fd, cap)
        finally:
            os.close(fd)
    return _read_capped(fd, cap, path)


def _read_capped(fd: int, cap: int, name: str) -> bytes:
    """Read ``fd`` to its end, at most ``cap`` bytes (``EFBIG`` past it); closes it."""
    try:
        data = bytearray()
        while len(data) <= cap and (chunk := os.read(fd, min(1 << 16, cap + 1 - len(data)))):
            data += chunk
        if len(data) > cap:
            raise OSError(errno.EFBIG, f"larger than {cap} bytes", name)
        return bytes(data)
    finally:
        os.close(fd)


def _setgroups(groups: list[int]) -> None:
    number = SYS_SETGROUPS.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"no thread-local setgroups known on {os.uname().machine}")
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


_ACTING = small.local()


@small.contextmanager
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
