"""Resource limits on cgroups, as pure data: what to create, what to write, how to read back.

Nothing here touches the machine.  :mod:`corral.cgroups` probes the host
into an :class:`Access`, creates the run's cgroups from a :class:`Plan` and
reads the kernel's counters back through :func:`usage`; :mod:`corral.watch`
checks disk and CPU time while the run lives.  Where each limit is enforced:

    limit         cgroup v2                 cgroup v1                     no cgroup
    memory        memory.max, swap.max 0    memory.limit_in_bytes, memsw, refused
                                            kmem.tcp (one split budget)
    pids          pids.max                  pids.max                      refused
    cpus          cpu.max                   cpu.cfs_quota_us              refused
    cpu (time)    cpu.stat, watched         cpuacct.usage, watched        refused
    disk          the workspace watcher and RLIMIT_FSIZE, on any host
    timeout, output: the launcher;  nofile, fsize, core: rlimits;  tmp, shm: tmpfs --size

"Refused" means the run stops with a :class:`~corral.errors.HostError`
naming the fix, unless the policy allows ``unenforced-limits``.

Where run cgroups go: ``<hierarchy>/corral/uid-<UID>/<run-id>`` on cgroup v1
(root creates ``uid-0`` itself; ``corral delegate --user NAME``, run once by
root, creates and hands over ``uid-<UID>`` for a plain user), and on cgroup v2
``<mount>/corral/<run-id>`` for root, ``<delegated>/corral/<run-id>`` for a
plain user whose own cgroup lies under a subtree delegated to them (systemd
gives one to every user session: ``systemd-run --user --scope``).
"""

from __future__ import annotations

import os

from .errors import HostError
from .policy import CORRAL_PIDS, Limits
from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Access", "Plan", "Usage", "describe", "doctor_rows", "plan", "requested", "usage",
           "verdict"]

# Processes of corral's own in every run, added to the pids limit so that
# ``--pids N`` leaves N to the command: bwrap, bwrap's PID 1 inside, corral's init.
OVERHEAD_PIDS = CORRAL_PIDS
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000  # the kernel's floor
PAGE = 4096
TCP_SHARE_MAX = 64 << 20  # v1: socket buffers of one run, at most (see tcp_share)
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
# A run that asks for any cgroup-backed limit joins these wherever available, so that it
# is metered (CPU time, peak memory, pids peak); "cpu" only when --cpus asks for it,
# since bandwidth changes scheduling.  A run that asks for none gets no cgroup: the
# fork that puts bwrap's child in one costs about 1 ms (see corral.cgroups).
METERING = ("memory", "pids", "cpuacct")

# Where a run's CPU bandwidth is capped (--cpus) the payload alone is in the cap: the run's
# cgroup there has a child, PAYLOAD, which corral's init moves the payload into before it
# starts it.  A payload that starved its init of CPU under a small quota (1000 spinning
# threads under --cpus 0.02) kept the init from seeing its launcher go, so the sandbox
# outlived a SIGKILLed corral by minutes.  On cgroup v2 a cgroup with children holds no
# processes: bwrap and the init go in a sibling, INIT.
PAYLOAD, INIT = "payload", "init"
PAYLOAD_ONLY = ("cpu",)  # controllers whose limits bind the payload alone

# limit name -> (Limits field, controller that enforces it)
ENFORCED_BY = {
    "memory": ("memory_bytes", "memory"),
    "pids": ("pids", "pids"),
    "cpus": ("cpus", "cpu"),
    "cpu": ("cpu_s", "cpuacct"),
}


class Access(NamedTuple):
    """What this caller may do with cgroups here; produced by :func:`corral.cgroups.probe`.

    ``bases`` maps each usable controller to the directory under which this
    caller creates run cgroups.  On cgroup v2 every controller shares one base
    and "cpuacct" stands for the CPU time every v2 cgroup reports.
    """

    version: int | None  # 1, 2, or None when there are no usable cgroups at all
    bases: tuple[tuple[str, str], ...] = ()  # (controller, base directory)
    absent: tuple[tuple[str, str], ...] = ()  # (controller, why it cannot be used)
    fix: str = ""  # how to make the absent ones usable
    memsw: bool = False  # v1: swap is accounted (memory.memsw.*), so it can be capped
    tcp: bool = False  # v1: socket buffers can be accounted (memory.kmem.tcp.*)
    swap_max: bool = False  # v2: memory.swap.max exists

    def base(self, controller: str) -> str | None:
        return dict(self.bases).get(controller)

    def why_not(self, controller: str) -> str:
        return dict(self.absent).get(controller, f"no {controller} controller")


class Plan(NamedTuple):
    """The cgroups one run joins and the limit files written before it starts."""

    version: int | None
    bases: tuple[tuple[str, str], ...]  # (controller, base); the run's cgroup is base/<run-id>
    settings: tuple[tuple[str, str, str], ...]  # (controller, file, content), in write order
    unenforced: tuple[str, ...] = ()  # limits requested, not enforceable, explicitly allowed

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.bases)

    def dirs(self, run_id: str) -> dict[str, str]:
        """controller -> the run's cgroup directory."""
        return {c: os.path.join(base, run_id) for c, base in self.bases}

    def unique_dirs(self, run_id: str) -> list[str]:
        """Each cgroup directory once: co-mounted v1 controllers and v2 share one."""
        return list(dict.fromkeys(self.dirs(run_id).values()))

    def payload_dirs(self, run_id: str) -> list[str]:
        """The run's PAYLOAD cgroups (see PAYLOAD_ONLY): none without a CPU cap."""
        dirs = self.dirs(run_id)
        return list(dict.fromkeys(os.path.join(dirs[c], PAYLOAD) for c in PAYLOAD_ONLY
                                  if c in dirs))

    def init_dir(self, run_id: str) -> str | None:
        """cgroup v2 with a PAYLOAD cgroup: where bwrap and corral's init go (INIT)."""
        if self.version != 2 or not self.payload_dirs(run_id):
            return None
        return os.path.join(self.unique_dirs(run_id)[0], INIT)

    def setting_path(self, run_id: str, controller: str, name: str) -> str:
        """Where a limit file of ``controller`` is written: PAYLOAD for PAYLOAD_ONLY."""
        here = self.dirs(run_id)[controller]
        return os.path.join(here, PAYLOAD, name) if controller in PAYLOAD_ONLY else \
            os.path.join(here, name)


class Usage(NamedTuple):
    """What the kernel counted for one run's cgroup."""

    cpu_s: float | None = None  # user + system CPU time of every process of the run
    peak_memory_bytes: int | None = None  # page cache, tmpfs pages, v1 socket buffers included
    oom_kills: int = 0  # processes the memory limit killed
    pids_peak: int | None = None  # most processes and threads at once, corral's 3 included
    pids_refused: int = 0  # forks refused at the pids limit


def requested(limits: Limits) -> list[str]:
    """Names of the cgroup-backed limits that ``limits`` asks for."""
    return [name for name, (field, _) in ENFORCED_BY.items()
            if getattr(limits, field) is not None]


def _settings(limits: Limits, access: Access) -> list[tuple[str, str, str]]:
    """Limit files in write order.  v1: memsw only after memory (the kernel keeps memsw >= mem)."""
    out: list[tuple[str, str, str]] = []
    memory, pids, cpus = limits.memory_bytes, limits.pids, limits.cpus
    if access.version == 1:
        if memory is not None:
            tcp = tcp_share(memory) if access.tcp else 0
            out.append(("memory", "memory.limit_in_bytes", str(memory - tcp)))
            out.append(("memory", "memory.memsw.limit_in_bytes", str(memory - tcp))
                       if access.memsw else ("memory", "memory.swappiness", "0"))
            if tcp:
                out.append(("memory", "memory.kmem.tcp.limit_in_bytes", str(tcp)))
        if pids is not None:
            out.append(("pids", "pids.max", str(pids + OVERHEAD_PIDS)))
        if cpus is not None:
            out.append(("cpu", "cpu.cfs_period_us", str(CFS_PERIOD_US)))
            out.append(("cpu", "cpu.cfs_quota_us", str(cfs_quota(cpus))))
    elif access.version == 2:
        if memory is not None:
            out.append(("memory", "memory.max", str(memory)))
            if access.swap_max:
                out.append(("memory", "memory.swap.max", "0"))
        if pids is not None:
            out.append(("pids", "pids.max", str(pids + OVERHEAD_PIDS)))
        if cpus is not None:
            out.append(("cpu", "cpu.max", f"{cfs_quota(cpus)} {CFS_PERIOD_US}"))
    return out


def tcp_share(memory: int) -> int:
    """cgroup v1: the part of a run's memory budget its TCP socket buffers may use.

    v1 counts socket buffers apart from memory (``memory.kmem.tcp.*``; v2
    charges them to memory), so two limits of ``memory`` each would let a run
    hold twice its budget.  The budget is split instead: the buffers get a
    quarter of it, at most TCP_SHARE_MAX, and memory the rest.  Whole pages,
    because the kernel keeps its limits in pages.
    """
    return min(memory // 4, TCP_SHARE_MAX) // PAGE * PAGE


def cfs_quota(cpus: float) -> int:
    return max(MIN_CFS_QUOTA_US, -int(-cpus * CFS_PERIOD_US // 1))  # ceil, without math


def plan(limits: Limits, access: Access, allow_unenforced: bool) -> Plan:
    """Which cgroups a run joins and what is written into them.

    Raises :class:`HostError` when a requested limit cannot be enforced here,
    unless ``allow_unenforced``; then the limit is listed in ``unenforced``.
    No cgroup-backed limit requested: no cgroup, and the run is not metered.
    """
    wanted = requested(limits)
    missing = [n for n in wanted if access.base(ENFORCED_BY[n][1]) is None]
    if missing and not allow_unenforced:
        raise refusal(missing, access)
    if not wanted:
        return Plan(access.version, (), ())
    joined = [c for c in METERING if access.base(c) is not None]
    if "cpus" in wanted and "cpus" not in missing:
        joined.append("cpu")
    bases = tuple((c, base) for c in joined if (base := access.base(c)) is not None)
    settings = tuple(s for s in _settings(limits, access) if s[0] in joined)
    return Plan(access.version, bases, settings, tuple(missing))


def refusal(missing: list[str], access: Access) -> HostError:
    names = ", ".join(n if n != "cpu" else "cpu time" for n in missing)
    why = "; ".join(dict.fromkeys(access.why_not(ENFORCED_BY[n][1]) for n in missing))
    fix = access.fix or "run corral where cgroups are available"
    return HostError(f"this host cannot enforce the run's {names} limit(s) (from the profile "
                     "or flags)", why,
                     f"{fix}; or pass --allow unenforced-limits to run without them")


def describe(plan: Plan, run_id: str = "RUN-ID") -> list[str]:
    """The cgroup part of ``--dry-run``: where the run would go and what is written there."""
    if not plan.bases:
        return ["# cgroup: none (no cgroup-backed limit requested, none usable for metering)"]
    lines = [f"# cgroup v{plan.version}: {d}" for d in plan.unique_dirs(run_id)]
    lines += [f"# cgroup v{plan.version}, the payload alone: {d}"
              for d in plan.payload_dirs(run_id)]
    lines += [f"#   {plan.setting_path(run_id, c, name)} <- {value}"
              for c, name, value in plan.settings]
    lines += [f"# not enforced (--allow unenforced-limits): {name}" for name in plan.unenforced]
    return lines


def _keyed(text: str | None) -> dict[str, int]:
    """Parse "key value" lines (memory.oom_control, memory.events, pids.events, cpu.stat)."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


# What to read for each version: (controller, file) pairs, read by corral.cgroups.
USAGE_FILES = {
    1: (("cpuacct", "cpuacct.usage"), ("memory", "memory.max_usage_in_bytes"),
        ("memory", "memory.kmem.tcp.max_usage_in_bytes"),
        ("memory", "memory.oom_control"), ("pids", "pids.peak"), ("pids", "pids.events")),
    2: (("cpuacct", "cpu.stat"), ("memory", "memory.peak"), ("memory", "memory.events"),
        ("pids", "pids.peak"), ("pids", "pids.events")),
}


def usage(version: int | None, read: Callable[[str, str], str | None]) -> Usage:
    """The counters of a run's cgroup; ``read(controller, file)`` gives a file's text or None."""
    pids_events = _keyed(read("pids", "pids.events"))
    if version == 1:
        ns = _int(read("cpuacct", "cpuacct.usage"))
        return Usage(
            cpu_s=None if ns is None else ns / 1e9,
            peak_memory_bytes=_v1_peak(read),
            oom_kills=_keyed(read("memory", "memory.oom_control")).get("oom_kill", 0),
            pids_peak=_int(read("pids", "pids.peak")),
            pids_refused=pids_events.get("max", 0))
    if version == 2:
        usec = _keyed(read("cpuacct", "cpu.stat")).get("usage_usec")
        return Usage(
            cpu_s=None if usec is None else usec / 1e6,
            peak_memory_bytes=_int(read("memory", "memory.peak")),
            oom_kills=_keyed(read("memory", "memory.events")).get("oom_kill", 0),
            pids_peak=_int(read("pids", "pids.peak")),
            pids_refused=pids_events.get("max", 0))
    return Usage()


def _v1_peak(read: Callable[[str, str], str | None]) -> int | None:
    """v1 peak: memory's and socket buffers' peaks added up (they share the budget; the sum
    of two peaks is at least the peak of the sum)."""
    memory = _int(read("memory", "memory.max_usage_in_bytes"))
    tcp = _int(read("memory", "memory.kmem.tcp.max_usage_in_bytes"))
    return None if memory is None else memory + (tcp or 0)


def cpu_seconds(version: int | None, text: str | None) -> float | None:
    """CPU time so far, from cpuacct.usage (v1) or cpu.stat (v2); for the CPU watcher."""
    if version == 1:
        ns = _int(text)
        return None if ns is None else ns / 1e9
    usec = _keyed(text).get("usage_usec")
    return None if usec is None else usec / 1e6


def verdict(status: str, exit_code: int, used: Usage | None) -> str:
    """The run's status once the cgroup has been read.

    The memory limit killed something and the command did not succeed: ``oom``.
    A command that survives the loss of a child and exits 0 keeps ``exited``.
    """
    if used is None or used.oom_kills == 0 or status not in ("exited", "signaled"):
        return status
    return status if status == "exited" and exit_code == 0 else "oom"


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/PID/cgroup -> {controller: path}; the v2 entry is keyed ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = parts[2]
    return out


def v2_delegated_base(own: str, mount: str, owner: Callable[[str], int | None], uid: int
                      ) -> str | None:
    """A plain user's v2 base: ``<D>/corral`` for the highest ancestor D of its own cgroup
    that it owns (directory and cgroup.procs), or None.

    Moving a process needs write access to cgroup.procs of the common ancestor
    of the source and destination cgroups, so only a subtree that contains
    corral's own cgroup will do.  ``owner(path)`` is the owner uid of a path.
    """
    parts = [p for p in own.split("/") if p]
    best = None
    for depth in range(len(parts), 0, -1):
        path = os.path.join(mount, *parts[:depth])
        if owner(path) != uid or owner(os.path.join(path, "cgroup.procs")) != uid:
            break
        best = path
    return None if best is None else os.path.join(best, "corral")


def doctor_rows(access: Access, limits: Limits, image_why: str | None = "not probed",
                bounded_ptys: bool = False) -> list[tuple[str, bool, str]]:
    """(name, enforced, how) for ``corral doctor``; ``limits`` are the profile defaults.

    ``image_why`` says why a fresh workspace cannot be an image of its own here (None:
    it can); ``bounded_ptys``, whether a sandbox can have a devpts with ``max=``.
    """
    def row(name: str, controller: str, how: str) -> tuple[str, bool, str]:
        base = access.base(controller)
        if base is None:
            return name, False, f"NOT enforced: {access.why_not(controller)}" + (
                f"; fix: {access.fix}" if access.fix else "")
        return name, True, f"cgroup v{access.version}: {how} ({base})"

    swap = ("swap capped" if access.memsw or access.swap_max
            else "swap not accounted here, swappiness 0")
    sockets = ("socket buffers charged to memory" if access.version == 2 else
               "socket buffers share the budget (a quarter of it, at most 64 MiB)"
               if access.tcp else "socket buffers not charged on this host")
    rows = [
        row("memory-limit", "memory", f"memory controller, {swap}, tmpfs pages count, "
            f"{sockets}"),
        row("pids-limit", "pids", "pids controller"),
        row("cpu-bandwidth", "cpu", "cpu controller (--cpus)"),
        row("cpu-time-limit", "cpuacct", "the run's CPU time, checked every 100 ms "
            "(RLIMIT_CPU per process too)"),
        _disk_row(image_why),
        ("open-files", True, f"at most {limits.files} open files per run: RLIMIT_NOFILE is "
         f"files / (pids + 3), {limits.process_nofile} per process in the shipped "
         "profiles; files held only by a memory mapping are bounded only by the memory limit"),
        ("ptys", True, "a devpts of the sandbox's own with max= (agent profiles: 64); runs "
         "get none" if bounded_ptys else "no pseudo-terminals in any sandbox here: a devpts "
         "with max= needs root or an unprivileged user namespace"),
        row("metering", "memory", "CPU time and peak memory read from the run's cgroup, "
            "for runs with a memory, pids, cpus or cpu limit (every shipped profile)"),
    ]
    needs = requested(limits)
    if needs:  # the shipped profiles' own limits
        missing = [n for n in needs if access.base(ENFORCED_BY[n][1]) is None]
        rows.append(("profile-defaults", not missing,
                     "the shipped profiles' limits are enforced here" if not missing else
                     f"runs with the shipped profiles stop with an error ({', '.join(missing)} "
                     f"unenforceable): {access.fix or 'no fix on this host'}, "
                     "or pass --allow unenforced-limits"))
    return rows


def _disk_row(image_why: str | None) -> tuple[str, bool, str]:
    if image_why is None:
        return ("disk-limit", True, "file system cap: a fresh workspace is an ext4 image of "
                "its own (limit + inputs + metadata), copied out after the run, so nothing "
                "the run does takes more of the disk; a reused --workspace is measured")
    return ("disk-limit", True, f"measured, not capped ({image_why}): every entry and "
            "every thread's open deleted files counted, checked every 25 ms or more; a run "
            "can exceed the limit by what it writes between two checks; RLIMIT_FSIZE caps "
            "one file")


# -- the disk cap: a size-capped file system image for a fresh workspace (root) ----------

MKE2FS = ("/usr/sbin/mke2fs", "/sbin/mke2fs")  # fixed places: never a PATH lookup
# One inode per 4 KiB block: the image runs out of inodes no sooner than of blocks, so
# empty files cost a block each, as the watcher counts them.  ext4's inode tables take
# 256/4096 of the image and its reserved clusters 2% (at most 16 MiB).
IMAGE_BYTES_PER_INODE = 4096
IMAGE_SLACK_DIVISOR = 8  # room for that metadata: an eighth of the capacity
IMAGE_SLACK_MIN = 1 << 20


def image_size(capacity: int) -> int:
    """Bytes of an ext4 image whose free space is at least ``capacity``."""
    size = capacity + capacity // IMAGE_SLACK_DIVISOR + IMAGE_SLACK_MIN
    return -(-size // PAGE) * PAGE


def mke2fs_argv(mke2fs: str, image: str, owner: tuple[int, int]) -> list[str]:
    """An ext4 without a journal (nothing of it outlives the run's copy-out), no blocks
    reserved for root, inode tables written lazily (the image stays sparse), its root
    directory owned by the payload's uid."""
    uid, gid = owner
    return [mke2fs, "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256",
            "-i", str(IMAGE_BYTES_PER_INODE), "-m", "0",
            "-O", "^has_journal,^resize_inode",
            "-E", f"lazy_itable_init=1,nodiscard,root_owner={uid}:{gid}", image]
