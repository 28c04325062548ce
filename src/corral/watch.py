"""Limits the launcher checks while a run lives: workspace disk use and whole-run CPU time.

Disk.  No mechanism that a plain user can set up caps a directory's size
on an ordinary file system, so the launcher measures what the run added to
its workspace and kills the run when it passes ``disk_bytes`` (status
``disk-limit``); the files stay.  The measure counts every entry under the
workspace once per inode, at least one block each (so a flood of empty
files or directories counts too), plus regular files on the workspace's file
system that the run's processes hold open after deleting them.  The bound
this gives: the run can exceed the limit by what it writes between two
checks.  Checks are every 25 ms, or 20 times what a measurement takes when
that is longer (so watching costs about 5% of one core at most), up to 5 s
apart.  RLIMIT_FSIZE (set to at most the disk limit by the init) stops
any single file at the limit.  A tree deeper than ``MAX_DEPTH`` or a
directory that cannot be read even after the launcher restores its owner
permissions counts as over the limit: what cannot be measured is refused.

CPU time.  RLIMIT_CPU is per process and a forking payload defeats it
(DESIGN fact 12), so the launcher also reads the run's cgroup CPU time
every 100 ms and ends the run once it is over ``cpu_s`` (status
``timeout``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["DiskUse", "Watch", "measure"]

BLOCK = 4096  # every entry costs at least this much
MAX_DEPTH = 200
MIN_INTERVAL_S = 0.025
MAX_INTERVAL_S = 5.0
COST_FACTOR = 20  # next check after this many times the last measurement's duration
CPU_INTERVAL_S = 0.1
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unmeasurable(Exception):
    """Part of the workspace cannot be measured; treated as over the limit."""


@dataclass(slots=True)
class DiskUse:
    """One measurement of a workspace."""

    bytes: int = 0
    complete: bool = True  # False when the walk stopped early, already over ``stop_at``
    seen: set[tuple[int, int]] = field(default_factory=set)


def _open_dir(name: str, parent: int, restore: bool) -> int:
    """Open a directory of the workspace to list it (``parent`` None: ``name`` is the top).

    A plain user's payload has the launcher's uid and may chmod a directory it
    owns so that its owner can neither list nor search it.  With ``restore``
    the owner's rights come back, through a handle that cannot be a symlink.
    """
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        if not restore or os.fstat(fd).st_mode & stat.S_IRWXU == stat.S_IRWXU:
            return fd
        os.close(fd)
    except PermissionError:
        if not restore:
            raise Unmeasurable(f"cannot read directory {name!r}") from None
    handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                     dir_fd=parent)
    try:
        mode = os.stat(handle).st_mode
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(mode) | stat.S_IRWXU)
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        raise Unmeasurable(f"cannot read directory {name!r}") from None
    finally:
        os.close(handle)


def _cost(st: os.stat_result) -> int:
    return max(st.st_blocks * 512, BLOCK)


def _walk(root: str, use: DiskUse, stop_at: int, restore: bool) -> None:
    """Add every entry under ``root``; return early once ``use.bytes`` passes ``stop_at``."""
    parent = os.open(os.path.dirname(root) or "/", DIR_FLAGS)
    try:
        top = _open_dir(os.path.basename(root), parent, restore)
    finally:
        os.close(parent)
    stack: list[tuple[int, list[str]]] = []
    try:
        stack.append((top, os.listdir(top)))
        while stack:
            fd, names = stack[-1]
            if not names:
                os.close(stack.pop()[0])
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in use.seen:
                continue
            use.seen.add((st.st_dev, st.st_ino))
            use.bytes += _cost(st)
            if use.bytes > stop_at:
                use.complete = False
                return
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise Unmeasurable(f"directories nested deeper than {MAX_DEPTH}")
                try:
                    sub = _open_dir(name, fd, restore)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # renamed or replaced since the stat: the next check sees it
                except OSError as e:
                    if e.errno != errno.ELOOP:  # replaced by a symlink, which is not followed
                        raise
                    continue
                try:
                    children = os.listdir(sub)
                except OSError:
                    os.close(sub)
                    raise Unmeasurable(f"cannot list directory {name!r}") from None
                stack.append((sub, children))
    finally:
        for fd, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def _deleted_open_files(pids: Sequence[int], dev: int, use: DiskUse) -> None:
    """Regular files on ``dev`` that the run's processes hold open after unlinking them."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and st.st_dev == dev \
                    and key not in use.seen:
                use.seen.add(key)
                use.bytes += _cost(st)


def measure(root: str, *, pids: Sequence[int] = (), stop_at: int = 1 << 62,
            restore: bool = False) -> DiskUse:
    """How much of the disk ``root`` and the files ``pids`` hold open take up.

    Raises :class:`Unmeasurable` when part of it cannot be read.
    """
    use = DiskUse()
    _walk(root, use, stop_at, restore)
    if use.complete:
        _deleted_open_files(pids, os.stat(root).st_dev, use)
    return use


class Watch:
    """Periodic checks for :class:`corral.launch.Launch`: :meth:`due`, then :meth:`check`."""

    def __init__(self, *, workspace: str, disk_bytes: int | None, cpu_s: float | None,
                 pids: Callable[[], list[int]] | None = None,
                 cpu_used: Callable[[], float | None] | None = None,
                 restore: bool = False) -> None:
        self.workspace = workspace
        self.disk_bytes = disk_bytes
        self.cpu_s = cpu_s if cpu_used is not None else None
        self.pids = pids or list
        self.cpu_used = cpu_used
        self.restore = restore  # a plain user's launcher may chmod u+rwx what it cannot read
        self.baseline = 0
        self.added: int | None = None
        self.limit_hit: str | None = None  # "disk" or "cpu"
        self.note = ""
        self.next_disk = self.next_cpu = 0.0
        self.last_cost = 0.0  # seconds the previous measurement took

    def start(self) -> None:
        """Measure the workspace before the run: the limit is on what the run adds."""
        if self.disk_bytes is not None:
            self.baseline = measure(self.workspace, restore=self.restore).bytes
        now = time.monotonic()
        self.next_disk = self.next_cpu = now + MIN_INTERVAL_S

    def due(self) -> float | None:
        times = [t for t, on in ((self.next_disk, self.disk_bytes is not None),
                                 (self.next_cpu, self.cpu_s is not None)) if on]
        return min(times) if times else None

    def check(self) -> str | None:
        """The status to end the run with, or None while it is within its limits."""
        now = time.monotonic()
        if self.cpu_s is not None and now >= self.next_cpu:
            self.next_cpu = now + CPU_INTERVAL_S
            if self._over_cpu():
                return "timeout"
        if self.disk_bytes is not None and now >= self.next_disk:
            if self._over_disk():
                return "disk-limit"
            # The smaller of the last two costs: one slow walk (cold caches, a busy
            # neighbour) must not stretch the interval, and the overshoot with it.
            took = time.monotonic() - now
            cost, self.last_cost = min(took, self.last_cost), took
            self.next_disk = now + min(max(MIN_INTERVAL_S, COST_FACTOR * cost), MAX_INTERVAL_S)
        return None

    def _over_cpu(self) -> bool:
        used = self.cpu_used() if self.cpu_used else None
        if used is None or self.cpu_s is None or used <= self.cpu_s:
            return False
        self.limit_hit, self.note = "cpu", f"used {used:.2f}s of CPU time, limit {self.cpu_s:g}s"
        return True

    def _over_disk(self) -> bool:
        assert self.disk_bytes is not None
        try:
            use = measure(self.workspace, pids=self.pids(),
                          stop_at=self.baseline + self.disk_bytes, restore=self.restore)
        except Unmeasurable as e:
            self.limit_hit, self.note = "disk", f"workspace cannot be measured: {e}"
            return True
        except OSError as e:
            self.limit_hit, self.note = "disk", f"workspace cannot be measured: {e.strerror}"
            return True
        self.added = use.bytes - self.baseline
        if use.complete and self.added <= self.disk_bytes:
            return False
        self.limit_hit = "disk"
        self.note = f"the run added more than {self.disk_bytes} bytes to its workspace"
        return True

    def finish(self) -> str | None:
        """A last look after the run: "disk-limit" if what it left is over the limit."""
        if self.disk_bytes is None or self.limit_hit is not None:
            return "disk-limit" if self.limit_hit == "disk" else None
        return "disk-limit" if self._over_disk() else None

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.disk_bytes is not None:
            out["workspace_bytes_added"] = self.added
        if self.limit_hit:
            out["limit_hit"] = self.limit_hit
            out["limit_note"] = self.note
        return out
