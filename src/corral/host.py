"""Host facts: what this machine's kernel and bwrap can do, probed once per process.

Only this module and :mod:`corral.launch` look at the machine.  Everything
else takes a :class:`HostFacts` and stays pure.
"""

from __future__ import annotations

import os
import stat

from . import small
from .errors import HostError
from .record import NamedTuple

__all__ = ["Cgroups", "HostFacts", "detect"]

BWRAP_MIN_DISABLE_USERNS = (0, 8, 0)


class Cgroups(NamedTuple):
    """Where cgroup controllers live.  v1 maps controller -> mount; v2 lists controllers."""

    v1: tuple[tuple[str, str], ...]  # (controller, mount point)
    v2_mount: str | None
    v2_controllers: tuple[str, ...]  # enabled in our own v2 cgroup's parent subtree

    @property
    def layout(self) -> str:
        if self.v1 and self.v2_mount:
            return "hybrid"
        if self.v1:
            return "v1"
        return "v2" if self.v2_mount else "none"

    def v1_mount(self, controller: str) -> str | None:
        return dict(self.v1).get(controller)


class HostFacts(NamedTuple):
    """A snapshot of the host, taken by :func:`detect`."""

    bwrap: str | None
    bwrap_version: tuple[int, int, int] | None
    bwrap_setuid: bool
    euid: int
    userns_max: int
    apparmor_restricts_userns: bool
    cgroups: Cgroups
    landlock_abi: int  # 0 when the kernel has no Landlock
    libseccomp: str | None  # version, None when libseccomp.so.2 cannot be loaded
    python: str  # the interpreter corral runs on (real path), used for the in-sandbox init
    python_prefix: str  # its installation prefix

    @property
    def is_root(self) -> bool:
        return self.euid == 0

    @property
    def can_disable_userns(self) -> bool:
        """bwrap --disable-userns needs bwrap 0.8 and a non-setuid install."""
        return (not self.bwrap_setuid and self.bwrap_version is not None
                and self.bwrap_version >= BWRAP_MIN_DISABLE_USERNS)

    def require_bwrap(self) -> str:
        if self.bwrap is None:
            raise HostError(
                "bwrap was not found on PATH (one that is not root's, in a folder of root's "
                "no one else can write, is never used: CORRAL_BWRAP names it anyway)",
                "corral runs every sandbox with bubblewrap",
                "install it: sudo apt-get install bubblewrap (Debian, Ubuntu), "
                "sudo dnf install bubblewrap (Fedora)",
            )
        return self.bwrap


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


MAX_BWRAP_BYTES = 8 << 20  # bwrap is ~70 KiB; a bigger file is not read for its version
# bwrap --version prints PACKAGE_STRING, one NUL-terminated constant in the binary
_PACKAGE_HEAD = b"\0bubblewrap "


def _bwrap_version(path: str) -> tuple[int, int, int] | None:
    """What ``bwrap --version`` says, read from the binary when it holds exactly one
    such string (starting it costs ~2 ms of every run's start), else by running it."""
    return _version_in_binary(path) or _version_by_running(path)


def _version_in_binary(path: str) -> tuple[int, int, int] | None:
    try:  # non-blocking and checked: CORRAL_BWRAP may name anything, a FIFO included
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BWRAP_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    found = _package_strings(data) if len(data) <= MAX_BWRAP_BYTES else []
    if len(found) != 1:  # a wrapper script, another build: ask the program
        return None
    return found[0]


def _package_strings(data: bytes) -> list[tuple[int, int, int]]:
    """Each ``\\0bubblewrap X.Y.Z\\0`` (a newline allowed before the last NUL) in ``data``:
    the version string bwrap is built with.  By hand, not with re: the command line does
    not import re (with enum) for this alone."""
    found, at = [], data.find(_PACKAGE_HEAD)
    while at >= 0:
        end = data.find(b"\0", at + len(_PACKAGE_HEAD))
        word = data[at + len(_PACKAGE_HEAD):end].removesuffix(b"\n") if end >= 0 else b""
        parts = word.split(b".")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            found.append((int(parts[0]), int(parts[1]), int(parts[2])))
        at = data.find(_PACKAGE_HEAD, at + 1)
    return found


def _version_by_running(path: str) -> tuple[int, int, int] | None:
    import re
    import subprocess

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                             env={"PATH": "/usr/bin:/bin"}, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _cgroups() -> Cgroups:
    v1: list[tuple[str, str]] = []
    v2_mount: str | None = None
    for line in (_read("/proc/self/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mount_point, fstype, options = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = mount_point
        elif fstype == "cgroup":
            v1.extend((opt, mount_point) for opt in options
                      if opt in ("memory", "pids", "cpu", "cpuacct", "freezer"))
    controllers: tuple[str, ...] = ()
    if v2_mount is not None:
        controllers = tuple((_read(os.path.join(v2_mount, "cgroup.controllers")) or "").split())
    return Cgroups(tuple(v1), v2_mount, controllers)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    landlock_create_ruleset = 444  # same number on every architecture
    create_ruleset_version = 1
    abi = libc.syscall(landlock_create_ruleset, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(create_ruleset_version))
    return max(int(abi), 0)


def libseccomp_version() -> str | None:
    import ctypes

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return None
    lib.seccomp_version.restype = ctypes.POINTER(Version)
    v = lib.seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def _python() -> tuple[str, str]:
    import sys

    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(prefix + "/"):
        # A virtualenv made with --copies: use the base installation's own binary.
        name = f"python{sys.version_info.major}.{sys.version_info.minor}"
        exe = os.path.realpath(os.path.join(prefix, "bin", name))
    return exe, prefix


def _system_owned(path: str) -> bool:
    """Whether the file ``path`` and its folder are root's and writable by no one else:
    nothing a sandbox (or another user) wrote could be there.  A plain user inside a user
    namespace (corral run within a sandbox) sees root's files as the overflow uid."""
    owners = {0} if os.geteuid() == 0 else {0, int(_read("/proc/sys/kernel/overflowuid")
                                                   or 65534)}
    for here in (path, os.path.dirname(path)):
        try:
            st = os.stat(here)
        except OSError:
            return False
        if st.st_uid not in owners or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def _executable_file(path: str) -> bool:
    """What shutil.which checks for a path with a slash (shutil costs ~2 ms to import,
    bz2 and lzma with it, on every start)."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def system_program(name: str) -> str | None:
    """The first program ``name`` on PATH that is the system's: root's, in a folder only
    root can write.  Every program corral itself runs on the host is found this way (or
    has a fixed place): one in a folder a payload could write (a project's ``bin`` or
    ``node_modules/.bin`` on PATH) is never started (DESIGN, wave 2, root 1)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder, name) if os.path.isabs(folder) else ""
        real = os.path.realpath(candidate) if candidate else ""
        if real and _executable_file(real) and _system_owned(real):
            # What was checked is what runs: the name on PATH may be a link the sandbox can
            # point elsewhere after the check (found by review).
            return real
    return None


def find_bwrap() -> str | None:
    """The system's bwrap (:func:`system_program`), not even started for its version
    otherwise; any other is named with CORRAL_BWRAP."""
    return system_program("bwrap")


@small.cache
def detect() -> HostFacts:
    """Probe the host once; later calls return the same facts."""
    bwrap = os.environ.get("CORRAL_BWRAP") or find_bwrap()
    bwrap = os.path.realpath(bwrap) if bwrap else None
    setuid = False
    if bwrap is not None:
        try:
            setuid = bool(os.stat(bwrap).st_mode & stat.S_ISUID)
        except OSError:
            bwrap = None
    python, prefix = _python()
    return HostFacts(
        bwrap=bwrap,
        bwrap_version=_bwrap_version(bwrap) if bwrap else None,
        bwrap_setuid=setuid,
        euid=os.geteuid(),
        userns_max=int(_read("/proc/sys/user/max_user_namespaces") or 0),
        apparmor_restricts_userns=_read(
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1",
        cgroups=_cgroups(),
        landlock_abi=landlock_abi(),
        libseccomp=libseccomp_version(),
        python=python,
        python_prefix=prefix,
    )
