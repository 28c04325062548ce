"""Mounts that one run needs and bwrap 0.8 cannot make: only that run ever sees them.

bwrap binds host paths; it cannot give a workspace a size cap or a devpts a
``max=``.  The launcher prepares both, and bwrap's own child (between fork
and exec, like the cgroup join in :mod:`corral.cgroups`) moves into a private
mount namespace and puts them in place there, where bwrap binds them like
any host path.  The host's mount table never holds them: when the run's last
process is gone, its namespace goes, and with it every mount the launcher
does not hold open itself.

* :func:`mount_fs` makes a detached mount (``fsopen``/``fsmount``, Linux 5.2),
  known only through the descriptor it returns; :class:`ChildMounts` attaches
  it at a path in the private namespace with ``move_mount``.  The launcher
  keeps its descriptor, so it can still read the file system after the run.
* :func:`attach_loop` binds an image file to a free loop device that detaches
  itself once nothing uses it (``LOOP_CONFIGURE`` with autoclear, Linux 5.8).
* A bounded devpts (``max=N``) is mounted over ``/dev/pts`` of the private
  namespace; bwrap's ``--dev-bind /dev/pts /dev/pts`` then carries it in.
  A plain user may mount devpts only in a user namespace of their own: the
  child makes one first, mapping only its own uid and gid, and bwrap nests its
  sandbox's user namespace inside it.

Everything here is I/O; the decisions (whether, how big) are in
:mod:`corral.limits` and :mod:`corral.enforce`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import time

from . import small

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ChildMounts", "attach_loop", "can_mount_devpts", "fs_context", "mount_fs"]

# Same numbers on x86_64 and aarch64 (the system calls added since 5.x are unified).
SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 429, 430, 431, 432
FSOPEN_CLOEXEC = FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 0, 1, 6
MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x2, 0x4
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NOEXEC, MS_REC, MS_SLAVE = 0x2, 0x8, 0x4000, 0x80000
LOOP_CTL_GET_FREE, LOOP_CONFIGURE, LO_FLAGS_AUTOCLEAR = 0x4C82, 0x4C0A, 4
LOOP_INFO64_SIZE, LOOP_INFO64_FLAGS = 232, 52  # struct loop_info64: size, lo_flags offset
LOOP_TRIES = 20  # another launcher may take the free device between asking and binding


@small.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount_fs(fstype: str, source: str, flags: tuple[str, ...] = ()) -> int:
    """A detached, nosuid, nodev mount of ``source`` with the file system's option
    ``flags`` set: an O_PATH descriptor of its root."""
    libc = _libc()
    fs = _check(libc.syscall(SYS_FSOPEN, fstype.encode(), FSOPEN_CLOEXEC), f"fsopen {fstype}")
    try:
        _check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, b"source",
                            os.fsencode(source), 0), f"fsconfig source={source}")
        for flag in flags:
            _check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_FLAG, flag.encode(), None, 0),
                   f"fsconfig {flag}")
        _check(libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0),
               f"mount {source}")
        return _check(libc.syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC,
                                   MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV), "fsmount")
    finally:
        os.close(fs)


def fs_context(fstype: str) -> int:
    """An unconfigured file system context (``fsopen``): whether this kernel has the new
    mount API and the file system type, for probes."""
    return _check(_libc().syscall(SYS_FSOPEN, fstype.encode(), FSOPEN_CLOEXEC),
                  f"fsopen {fstype}")


def attach_loop(image: str) -> tuple[str, int]:
    """Bind ``image`` to a free loop device that detaches once unused: its path, and an
    open descriptor of it.

    The device stays bound while something holds it open or mounted: the caller
    mounts it, then closes the descriptor, and autoclear does the rest.
    """
    for _ in range(LOOP_TRIES):
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
        finally:
            os.close(ctl)
        device = f"/dev/loop{number}"
        dev = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        backing = os.open(image, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            info = bytearray(LOOP_INFO64_SIZE)
            struct.pack_into("I", info, LOOP_INFO64_FLAGS, LO_FLAGS_AUTOCLEAR)
            config = struct.pack("II", backing, 0) + bytes(info) + bytes(64)
            fcntl.ioctl(dev, LOOP_CONFIGURE, config)
            return device, dev
        except OSError as e:
            os.close(dev)
            if e.errno != errno.EBUSY:
                raise
        finally:
            os.close(backing)
        time.sleep(0.001)
    raise OSError(errno.EBUSY, "no free loop device")


class ChildMounts:
    """What bwrap's child does between fork and exec: a private mount namespace (inside a
    user namespace of its own first, for a plain user's devpts), detached mounts moved to
    their places, a devpts with ``max=`` over ``/dev/pts``.

    Call :meth:`step` in the child only.  Everything it needs is encoded beforehand,
    and it makes no allocation the fork could have left locked.
    """

    def __init__(self, *, own_userns: bool) -> None:
        _libc()  # loaded here: the dynamic loader must not run in the forked child
        self.own_userns = own_userns  # a plain user: mounts need a user namespace of ours
        self.moves: list[tuple[int, bytes]] = []  # (detached mount fd, target path)
        self.devpts: bytes | None = None
        self.maps = ((b"/proc/self/setgroups", b"deny"),
                     (b"/proc/self/uid_map", f"{os.getuid()} {os.getuid()} 1".encode()),
                     (b"/proc/self/gid_map", f"{os.getgid()} {os.getgid()} 1".encode()))

    def move(self, mount_fd: int, target: str) -> None:
        self.moves.append((mount_fd, os.fsencode(target)))

    def bounded_devpts(self, max_ptys: int) -> None:
        self.devpts = f"newinstance,ptmxmode=0666,mode=0620,max={max_ptys}".encode()

    @property
    def wanted(self) -> bool:
        return bool(self.moves) or self.devpts is not None

    def joiner_args(self) -> tuple[list[str], list[int]]:
        """:meth:`step` as options of the compiled init's ``--join`` mode (corral.cinit),
        in the same order, and the descriptors it must inherit (the detached mounts,
        which it closes once they are moved: bwrap never holds them)."""
        args: list[str] = []
        if self.own_userns:
            args += ["--userns", str(os.getuid()), str(os.getgid())]
        args.append("--slave")
        for mount_fd, target in self.moves:
            args += ["--move", str(mount_fd), os.fsdecode(target)]
        if self.devpts is not None:
            args += ["--devpts", self.devpts.decode()]
        return args, [fd for fd, _ in self.moves]

    def step(self) -> None:
        """In the forked child: raises OSError, which fails the child before exec."""
        libc = _libc()
        flags = CLONE_NEWNS | (CLONE_NEWUSER if self.own_userns else 0)
        _check(libc.unshare(flags), "unshare")
        if self.own_userns:
            for path, text in self.maps:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, text)
                finally:
                    os.close(fd)
        # Nothing mounted here may propagate back to the host.
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "make / a slave")
        for mount_fd, target in self.moves:
            _check(libc.syscall(SYS_MOVE_MOUNT, mount_fd, b"", AT_FDCWD, target,
                                MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
        if self.devpts is not None:
            _check(libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC,
                              self.devpts), "mount devpts")


# can_mount_devpts's answers, per own_userns: the host does not change its mind under a
# running process.  A probe begun ahead (probe_devpts) is reaped by whoever asks first.
_DEVPTS: dict[bool, bool] = {}
_DEVPTS_PENDING: dict[bool, int] = {}
PROBE_COMMAND = "/bin/true"  # what the background probe's joiner execs once it mounted


def can_mount_devpts(own_userns: bool) -> bool:
    """Whether :meth:`ChildMounts.step` can mount a bounded devpts here (tried once, in a
    throwaway child: AppArmor, for one, may forbid a plain user's user namespaces).

    The child is the one :func:`probe_devpts` began, if any (its answer is waited for
    here), else a fork of this process tried now.  Any failure means no: the sandbox
    then gets no pseudo-terminals at all, never the host's unbounded devpts."""
    if (known := _DEVPTS.get(own_userns)) is not None:
        return known
    pid = _DEVPTS_PENDING.pop(own_userns, None)  # atomic: one caller reaps it
    if pid is not None:
        answer = _reaped(pid) == 0
    else:
        mounts = ChildMounts(own_userns=own_userns)
        mounts.bounded_devpts(1)
        answer = _in_child(mounts.step)
    _DEVPTS[own_userns] = answer
    return answer


def probe_devpts(own_userns: bool, binary: str | None) -> None:
    """Begin :func:`can_mount_devpts`'s trial in the background, so that a run's launcher
    does not wait for it (a fork of this process, a namespace made and torn down: 2-4 ms).

    ``binary`` is the run's compiled init: its ``--join`` mode makes the same mounts the
    launch will (corral.cinit.join_prefix), spawned without copying this process, then
    execs :data:`PROBE_COMMAND`; its exit status is the answer.  Without the compiled init
    (or that command), nothing is begun and can_mount_devpts forks as before."""
    if (binary is None or own_userns in _DEVPTS or own_userns in _DEVPTS_PENDING
            or not os.access(PROBE_COMMAND, os.X_OK)):
        return
    from . import cinit

    mounts = ChildMounts(own_userns=own_userns)
    mounts.bounded_devpts(1)
    args, _ = mounts.joiner_args()
    argv = [*(cinit.join_prefix(binary, [], args) or []), PROBE_COMMAND]
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:
        pid = os.posix_spawn(binary, argv, {}, file_actions=quiet)
    except OSError:
        return  # can_mount_devpts tries it itself
    _DEVPTS_PENDING[own_userns] = pid


def _reaped(pid: int) -> int:
    try:
        return os.waitpid(pid, 0)[1]  # retried on EINTR by Python itself (PEP 475)
    except ChildProcessError:  # reaped by someone else: no answer, so no
        return -1


def _in_child(step: Callable[[], None]) -> bool:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's outcome is its exit status
        code = 1
        try:
            step()
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1] == 0
