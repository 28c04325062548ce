"""Limits the launcher checks while a run lives: workspace disk use and whole-run CPU time.

Disk.  Started by root, a fresh workspace is a file system image
(:mod:`corral.diskimage`) that caps the run by construction; the watcher reads
its use with ``statvfs`` (exact, constant-time) every 25 ms and ends the run
(status ``disk-limit``) once it added more than ``disk_bytes`` or filled the
image.  Elsewhere (a plain user; a reused ``--workspace``; a host without loop
devices) the watcher measures (:mod:`corral.diskuse`) and ends the run over
the limit or when the workspace cannot be measured; then the run can exceed
the limit by what it writes between two checks.  Checks are every 25 ms, or
20 times what a measurement takes when that is longer (so watching costs
about 5% of one core at most), up to 5 s apart.  RLIMIT_FSIZE (set to at
most the disk limit by the init) stops any single file at the limit.

Disk measurements run in a thread of their own, so a slow one never delays
the supervision loop (the timeout, the output cap); the thread wakes the loop
through :meth:`Watch.fileno` when the run must end.  An image's ``statvfs``
takes microseconds: the loop makes it itself (:meth:`due`, :meth:`check`), and
a run with an image starts no thread (nor imports ``threading``: corral.small
says why that matters).  What the record says
about use is a lower bound whenever a measurement stopped early.

CPU time.  RLIMIT_CPU is per process and a forking payload defeats it
(DESIGN fact 12), so the supervision loop also reads the run's cgroup CPU
time every 100 ms (:meth:`due`, :meth:`check`: one small read) and ends the
run once it is over ``cpu_s`` (status ``timeout``).  What a run uses after its
last check (up to 100 ms on every core) is caught by :meth:`Watch.finish`, which
compares the cgroup's final count with the limit (review 41: a burst shorter than
one interval ended with status ``exited``, over the limit and not reported).
"""

from __future__ import annotations

import os
import time

from . import small
from .errors import UsageError, start_thread

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable
    from threading import Event, Thread

    from .diskimage import Image

__all__ = ["Watch"]

MIN_INTERVAL_S = 0.025
MAX_INTERVAL_S = 5.0
COST_FACTOR = 20  # next check after this many times the last measurement's duration
CPU_INTERVAL_S = 0.1


class Watch:
    """Checks for :class:`corral.launch.Launch`: :meth:`start`, then :meth:`due` and
    :meth:`check` from the loop, :meth:`fileno` readable on a disk verdict; always
    :meth:`stop`; then :meth:`finish` for a last look."""

    def __init__(self, *, workspace: str, disk_bytes: int | None, cpu_s: float | None,
                 pids: Callable[[], list[int]] | None = None,
                 cpu_used: Callable[[], float | None] | None = None,
                 restore: bool = False, image: Image | None = None) -> None:
        self.workspace = workspace
        self.disk_bytes = disk_bytes
        self.cpu_s = cpu_s if cpu_used is not None else None
        self.pids = pids or list
        self.cpu_used = cpu_used
        self.restore = restore  # a plain user's launcher may chmod u+rwx what it cannot read
        self.image = image  # the workspace's own file system, when it has one
        self.baseline = 0
        self.added: int | None = None
        self.exact = True  # False: ``added`` is a lower bound
        self.limit_hit: str | None = None  # "disk" or "cpu"
        self.note = ""
        self.next_cpu = 0.0
        self.next_disk: float | None = None  # the image's next look, made by the loop
        self.stopping: Event | None = None  # with the disk thread (threading: then only)
        self.thread: Thread | None = None
        self.wake_r = self.wake_w = -1

    # -- the loop's side -----------------------------------------------------------

    def start(self) -> None:
        """Measure the workspace before the run (the limit is on what the run adds), then
        start the disk thread."""
        if self.disk_bytes is not None:
            self.baseline = self._baseline()
        if self.disk_bytes is not None and self.image is not None:
            self.next_disk = time.monotonic() + MIN_INTERVAL_S
        elif self.disk_bytes is not None:
            self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            import threading  # (corral.small says why not at the top)

            self.stopping = threading.Event()
            self.thread = start_thread(self._disk_loop, "corral-disk-watch")
        self.next_cpu = time.monotonic() + MIN_INTERVAL_S

    def fileno(self) -> int | None:
        """Readable once the disk thread has ended the run's right to go on."""
        return self.wake_r if self.thread is not None else None

    def due(self) -> float | None:
        times = [t for t in (self.next_cpu if self.cpu_s is not None else None,
                             self.next_disk) if t is not None]
        return min(times) if times else None

    def check(self) -> str | None:
        """The status to end the run with for the image's use or CPU time, or None while
        within the limits."""
        now = time.monotonic()
        if self.next_disk is not None and now >= self.next_disk:
            self.next_disk = now + MIN_INTERVAL_S
            if self._image_over():
                return "disk-limit"
        if self.cpu_s is None or now < self.next_cpu:
            return None
        self.next_cpu = now + CPU_INTERVAL_S
        return self._over_cpu(self.cpu_used() if self.cpu_used else None)

    def _over_cpu(self, used: float | None) -> str | None:
        """The status "timeout" (and why, for the record) when ``used`` is over ``cpu_s``."""
        if self.cpu_s is None or used is None or used <= self.cpu_s:
            return None
        self.limit_hit, self.note = "cpu", f"used {used:.2f}s of CPU time, limit {self.cpu_s:g}s"
        return "timeout"

    def verdict(self) -> str | None:
        """After :meth:`fileno` became readable: the status to end the run with."""
        return "disk-limit" if self.limit_hit == "disk" else None

    def stop(self) -> None:
        """End the disk thread (promptly: a measurement looks at the flag as it goes)."""
        self.next_disk = None
        if self.stopping is not None:
            self.stopping.set()
        if self.thread is not None:
            self.thread.join()
        for fd in (self.wake_r, self.wake_w):
            if fd >= 0:
                with small.suppress(OSError):
                    os.close(fd)
        self.wake_r = self.wake_w = -1

    def finish(self, cpu_used: float | None = None) -> str | None:
        """A last look after the run, with ``cpu_used`` the cgroup's final CPU time:
        "disk-limit" if what it left is over the disk limit, "timeout" if it used more
        CPU time than ``cpu_s`` (after the loop's last check), else None."""
        if self.disk_bytes is not None:
            if self.limit_hit is None:
                self._over_disk(final=True)
            elif self.image is not None:
                self._image_over()  # the exact figure, for the record
            if self.limit_hit == "disk":
                return "disk-limit"
        return self._over_cpu(cpu_used) if self.limit_hit is None else None

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.disk_bytes is not None:
            out["workspace_bytes_added"] = self.added
            out["workspace_bytes_added_is"] = "exact" if self.exact else "at least"
            if self.image is not None:
                out.update(self.image.describe())
            else:
                out["disk_enforcement"] = "observed"
        if self.limit_hit:
            out["limit_hit"] = self.limit_hit
            out["limit_note"] = self.note
        return out

    # -- the disk thread -------------------------------------------------------------

    def _baseline(self) -> int:
        if self.image is not None:
            return self.image.used()[0]
        from .diskuse import Unmeasurable, measure  # the walk: a workspace without an image

        try:
            return measure(self.workspace, restore=self.restore).bytes
        except (Unmeasurable, OSError) as e:
            raise UsageError(f"workspace {self.workspace} cannot be measured for the disk "
                             f"limit ({e})", "what cannot be measured cannot be bounded",
                             "use a fresh workspace, or drop the disk limit") from None

    def _disk_loop(self) -> None:
        # The next check waits on the smaller of the last two costs: one slow walk (cold
        # caches, a busy neighbour) must not stretch the interval, and the overshoot with it.
        from .diskuse import Stopped  # (a run with an image has no thread: see start)

        assert self.stopping is not None
        costs = (0.0, 0.0)
        while not self.stopping.wait(self._interval(min(costs))):
            started = time.monotonic()
            try:
                over = self._over_disk(final=False)
            except Stopped:
                return
            costs = (costs[1], time.monotonic() - started)
            if over:
                with small.suppress(OSError):
                    os.write(self.wake_w, b"!")
                return

    def _interval(self, cost: float) -> float:
        return min(max(MIN_INTERVAL_S, COST_FACTOR * cost), MAX_INTERVAL_S)

    def _over_disk(self, final: bool) -> bool:
        """Measure once; on a verdict, set ``limit_hit`` and ``note`` and return True."""
        if self.image is not None:
            return self._image_over()
        assert self.disk_bytes is not None
        from .diskuse import Unmeasurable, measure

        try:
            use = measure(self.workspace, pids=() if final else self.pids,
                          stop_at=self.baseline + self.disk_bytes, restore=self.restore,
                          stop=None if final else self.stopping)
        except Unmeasurable as e:
            return self._hit(f"workspace cannot be measured: {e}")
        except OSError as e:
            return self._hit(f"workspace cannot be measured: {e.strerror}")
        self.added, self.exact = use.bytes - self.baseline, use.complete
        if use.complete:
            return False
        return self._hit(f"the run added more than {self.disk_bytes} bytes to its workspace")

    def _image_over(self) -> bool:
        assert self.image is not None and self.disk_bytes is not None
        used, _, full = self.image.used()
        self.added = used - self.baseline
        if self.limit_hit is not None:
            return True
        if full:
            return self._hit("the run filled its workspace's file system")
        if self.added > self.disk_bytes:
            return self._hit(f"the run added more than {self.disk_bytes} bytes to its "
                             "workspace")
        return False

    def _hit(self, note: str) -> bool:
        if self.image is None:
            self.exact = False
        self.limit_hit, self.note = "disk", note
        return True
