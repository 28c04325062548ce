"""Cgroups on the machine: probe them, make one run's, start bwrap inside, read, kill, remove.

The decisions (which controllers, which files, what the numbers mean) are
pure and live in :mod:`corral.limits`; this module only does the I/O.

Starting the child inside its cgroup: writing a pid into ``cgroup.procs``
takes the kernel's global cgroup_threadgroup_rwsem for writing, which waits
for an RCU grace period unless another move just happened: 6.6 ms for four
hierarchies, measured here with runs 100 ms apart (bench/RESULTS.md).
Writing ``0`` ("the calling thread") into a v1 ``tasks`` file moves one
thread without that lock (kernel/cgroup/cgroup.c, cgroup_procs_write_start).
So bwrap's child, single-threaded between fork and exec, writes ``0`` into
each ``tasks`` file of the run itself; bwrap and all it starts inherit the
cgroups.  Two tempting alternatives are wrong: a launcher thread that moves
itself and spawns bwrap gets bwrap's process tree moved with it (and a thread's
exit ends a parent-death signal such as bwrap's --die-with-parent), and a launcher thread
parked in the run's memory cgroup could be picked by its OOM killer.  cgroup
v2 moves whole processes only; there the child writes ``0`` into
``cgroup.procs`` (clone3's CLONE_INTO_CGROUP would avoid the lock, but
Python's subprocess cannot use it).
"""

from __future__ import annotations

import errno
import os
import pwd
import time

from . import sig as signal
from . import small
from .errors import HostError
from .host import Cgroups, HostFacts
from .limits import (
    INIT,
    PAYLOAD,
    PAYLOAD_ONLY,
    V1_CONTROLLERS,
    Access,
    Plan,
    Usage,
    cpu_seconds,
    parse_proc_cgroup,
    usage,
    v2_delegated_base,
)

__all__ = ["RunCgroup", "delegate", "end_leftover", "probe", "sweep_stale"]

KILL_WAIT_S = 10.0  # how long teardown keeps killing before it reports failure
REMOVE_WAIT_S = 5.0  # how long rmdir is retried while the kernel says EBUSY (DESIGN fact 15)
STALE_S = 600.0  # an empty run cgroup older than this lost its launcher (sweep_stale)
SWEEP_EVERY_S = 60.0  # how often one launcher process sweeps a base (a pool runs many)
_swept: dict[str, float] = {}  # base -> when this process last swept it (monotonic)
V2_CONTROLLERS = ("memory", "pids", "cpu")


TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeVar

    class Spawned(Protocol):
        pid: int

    P = TypeVar("P", bound=Spawned)
    Start = Callable[[Callable[[], None] | None], P]


def _read(path: str) -> str | None:
    """The file's text; None if it cannot be read.  Raw descriptors: open() built a
    buffered text stream for each of the ~20 files a run reads, 8 system calls apiece
    where 3 do (issue 12: the launcher's CPU per run)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# -- probing ------------------------------------------------------------------

def probe(facts: HostFacts) -> Access:
    """What this caller may do with cgroups here: usable controllers, or why not."""
    cg = facts.cgroups
    if cg.v1_mount("memory") or cg.v1_mount("pids"):
        return _probe_v1(cg, facts.euid)
    if cg.v2_mount:
        return _probe_v2(cg.v2_mount, cg.v2_controllers, facts.euid)
    return Access(None, absent=tuple((c, "this host has no cgroup file system mounted")
                                     for c in V1_CONTROLLERS))


def _probe_v1(cg: Cgroups, uid: int) -> Access:
    bases, absent = [], []
    for c in V1_CONTROLLERS:
        mount = cg.v1_mount(c)
        if mount is None:
            absent.append((c, f"the cgroup v1 {c} controller is not mounted"))
            continue
        base = os.path.join(mount, "corral", f"uid-{uid}")
        if uid == 0 and os.access(mount, os.W_OK):
            bases.append((c, base))
        elif uid == 0:
            absent.append((c, f"{mount} is read-only here"))
        elif _owner(base) == uid and os.access(base, os.W_OK | os.X_OK):
            bases.append((c, base))
        else:
            absent.append((c, f"cgroup v1 {c} is not delegated to {_user_name(uid)} "
                              f"({base} does not exist or is not theirs)"))
    delegable = uid != 0 and any("not delegated" in why for _, why in absent)
    memory = cg.v1_mount("memory")
    return Access(
        version=1, bases=tuple(bases), absent=tuple(absent),
        fix=f"as root, once: corral delegate --user {_user_name(uid)}" if delegable else "",
        memsw=bool(memory) and os.path.exists(
            os.path.join(memory or "", "memory.memsw.limit_in_bytes")),
        tcp=bool(memory) and os.path.exists(
            os.path.join(memory or "", "memory.kmem.tcp.limit_in_bytes")))


def _probe_v2(mount: str, root_controllers: tuple[str, ...], uid: int) -> Access:
    if uid == 0:
        base: str | None = os.path.join(mount, "corral")
        available = set(root_controllers)
    else:
        own = parse_proc_cgroup(_read("/proc/self/cgroup") or "").get("", "/")
        base = v2_delegated_base(own, mount, _owner, uid)
        parent = os.path.dirname(base) if base else mount
        available = set((_read(os.path.join(parent, "cgroup.controllers")) or "").split())
    if base is None:
        why = "no cgroup v2 subtree is delegated to this user"
        return Access(2, absent=tuple((c, why) for c in (*V2_CONTROLLERS, "cpuacct")),
                      fix="start corral inside a delegated cgroup, e.g. "
                          "systemd-run --user --scope corral ...")
    bases = [(c, base) for c in V2_CONTROLLERS if c in available]
    bases.append(("cpuacct", base))  # every v2 cgroup reports cpu.stat usage_usec
    absent = [(c, f"the cgroup v2 {c} controller is not available under {os.path.dirname(base)}")
              for c in V2_CONTROLLERS if c not in available]
    return Access(2, tuple(bases), tuple(absent), swap_max="memory" in available)


# -- one run's cgroups ----------------------------------------------------------

class RunCgroup:
    """The cgroups of one run: :meth:`create`, :meth:`spawn` inside, then always :meth:`close`."""

    def __init__(self, plan: Plan, run_id: str) -> None:
        self.plan = plan
        self.run_id = run_id
        self.dirs = plan.dirs(run_id)
        self.unique = plan.unique_dirs(run_id)
        self.payload = plan.payload_dirs(run_id)  # the payload alone (limits.PAYLOAD_ONLY)
        self.init_dir = plan.init_dir(run_id)  # v2 with a payload cgroup: bwrap and the init
        self.made: list[str] = []
        self.removed = False

    @property
    def version(self) -> int | None:
        return self.plan.version

    def path(self, controller: str, name: str) -> str:
        return os.path.join(self.dirs[controller], name)

    def create(self) -> None:
        """Make the run's cgroups and write its limits, checked by reading them back."""
        try:
            for base in dict.fromkeys(os.path.dirname(d) for d in self.unique):
                self._ensure_base(base)
                _sweep_now_and_then(base)
            for d in self.unique:
                os.mkdir(d, 0o755)
                self.made.append(d)
            if self.init_dir is not None:  # v2: only a cgroup without processes delegates
                _write(os.path.join(self.unique[0], "cgroup.subtree_control"),
                       " ".join(f"+{c}" for c in PAYLOAD_ONLY))
            for d in ([self.init_dir] if self.init_dir else []) + self.payload:
                os.mkdir(d, 0o755)
                self.made.append(d)
            for controller, name, value in self.plan.settings:
                self._set(self.plan.setting_path(self.run_id, controller, name), value)
        except OSError as e:
            self.remove()
            raise HostError(f"cannot set up the run's cgroup ({e.filename or ''}: "
                            f"{e.strerror or e})", "the limits could not be put in place",
                            "run 'corral doctor' to see what this host enforces") from None

    def _ensure_base(self, base: str) -> None:
        if os.path.isdir(base):
            return
        os.makedirs(base, 0o755, exist_ok=True)
        if self.version == 2:  # v2: controllers reach a cgroup only through its parents
            wanted = " ".join(f"+{c}" for c in V2_CONTROLLERS if c in self.plan.controllers)
            for d in (os.path.dirname(base), base):
                if wanted:
                    _write(os.path.join(d, "cgroup.subtree_control"), wanted)

    def _set(self, path: str, value: str) -> None:
        _write(path, value)
        got = (_read(path) or "").strip()
        page = os.sysconf("SC_PAGE_SIZE")
        ok = got == value or (value.isdigit() and got.isdigit()
                              and 0 <= int(value) - int(got) < page)
        if not ok:
            raise OSError(errno.EIO, f"wrote {value}, the kernel kept {got or 'nothing'}", path)

    def _targets(self) -> list[bytes]:
        dirs = [self.init_dir] if self.init_dir is not None else self.unique
        return [os.fsencode(os.path.join(d, "tasks" if self.version == 1 else "cgroup.procs"))
                for d in dirs]

    def payload_files(self) -> list[str]:
        """What corral's init writes 0 into, in the payload's process before it runs
        anything, to put it in its PAYLOAD cgroups: opened by the launcher, whose right to
        move the process the kernel checks (the credentials the file was opened with)."""
        return [os.path.join(d, "cgroup.procs") for d in self.payload]

    def join_files(self) -> list[str]:
        """The files the compiled init's ``--join`` mode (corral.cinit.join_prefix) writes 0
        into, as :meth:`child_step` does, before it execs bwrap."""
        return [os.fsdecode(t) for t in self._targets()]

    def child_step(self) -> Callable[[], None]:
        """What bwrap's child runs between fork and exec to join the run's cgroups.

        The child moves itself, so nothing of corral's ever sits in the run's
        cgroups (where the OOM killer could pick it).  A failed move fails the
        child before exec: nothing starts unlimited.
        """
        targets = self._targets()

        def join() -> None:  # in the forked child: os calls only, paths made beforehand
            for path in targets:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)

        return join

    def spawn(self, start: Start[P]) -> P:
        """Start a process inside the run's cgroups; ``start(preexec)`` does the Popen."""
        import subprocess  # (only a caller that uses it: corral.launch starts bwrap itself)

        try:
            return start(self.child_step())
        except subprocess.SubprocessError as e:
            raise HostError("bwrap could not enter the run's cgroup", str(e),
                            "run 'corral doctor' to see what this host enforces") from None

    # -- while it runs, and after -------------------------------------------------

    def pids(self) -> list[int]:
        """Processes in any of the run's cgroups now (on v2, its children hold them)."""
        dirs = [self.init_dir, *self.payload] if self.init_dir is not None else self.unique
        text = " ".join(_read(os.path.join(d, "cgroup.procs")) or "" for d in dirs)
        return list(dict.fromkeys(int(p) for p in text.split() if p.isdigit()))

    def cpu_s(self) -> float | None:
        if "cpuacct" not in self.dirs:
            return None
        name = "cpuacct.usage" if self.version == 1 else "cpu.stat"
        return cpu_seconds(self.version, _read(self.path("cpuacct", name)))

    def usage(self) -> Usage:
        def read(controller: str, name: str) -> str | None:
            return _read(self.path(controller, name)) if controller in self.dirs else None

        return usage(self.version, read)

    def kill(self) -> bool:
        """SIGKILL everything in the run's cgroups until they are empty; False if they stay busy.

        The CPU cap is lifted first: a killed process dies only once it runs, and under a
        small quota a thousand threads took minutes to."""
        for d in self.payload:
            with small.suppress(OSError):
                if self.version == 1:
                    _write(os.path.join(d, "cpu.cfs_quota_us"), "-1")
                else:
                    _write(os.path.join(d, "cpu.max"), "max")
        if self.version == 2 and os.path.exists(os.path.join(self.unique[0], "cgroup.kill")):
            with small.suppress(OSError):
                _write(os.path.join(self.unique[0], "cgroup.kill"), "1")
        deadline = time.monotonic() + KILL_WAIT_S
        pause = 0.0005
        while pids := self.pids():
            for pid in pids:
                self._kill(pid)
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return True

    def _kill(self, pid: int) -> None:
        """Kill ``pid`` only if, held by a pidfd, it is still in our cgroup (pids get reused)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            where = parse_proc_cgroup(_read(f"/proc/{pid}/cgroup") or "")
            if any(p.endswith("/" + self.run_id) for p in where.values()):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> bool:
        """rmdir the run's cgroups, retrying while the kernel briefly says EBUSY."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        pause = 0.0002
        while self.made:
            try:
                os.rmdir(self.made[-1])
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            self.made.pop()
        self.removed = True
        return True

    def close(self) -> Usage:
        """Kill what is left, read the final counters, remove the cgroups."""
        self.kill()
        used = self.usage()
        self.remove()
        return used

    def describe(self) -> dict[str, object]:
        """For the run record."""
        return {"version": self.version, "cgroups": self.unique, "removed": self.removed,
                "settings": {name: value for _, name, value in self.plan.settings},
                **({"payload_cgroups": self.payload} if self.payload else {})}


def end_leftover(facts: HostFacts, run_id: str) -> bool:
    """Kill whatever still runs in the cgroups of run ``run_id``, whose launcher is gone
    (its audit is about to be redone: nothing of the run may act after it); whether any
    of its cgroups was there.  The cap is lifted first, as :meth:`RunCgroup.kill` does."""
    access = probe(facts)
    plan = Plan(access.version, access.bases, ())
    run = RunCgroup(plan, run_id)
    if not any(os.path.isdir(d) for d in run.unique):
        return False
    run.payload = [d for d in (os.path.join(run.dirs[c], PAYLOAD) for c in PAYLOAD_ONLY
                               if c in run.dirs) if os.path.isdir(d)]
    if access.version == 2 and os.path.isdir(os.path.join(run.unique[0], INIT)):
        run.init_dir = os.path.join(run.unique[0], INIT)
    run.kill()
    return True


def sweep_stale(base: str, now: float | None = None) -> list[str]:
    """Remove the empty run cgroups in ``base`` older than STALE_S; returns their names.

    A launcher killed outright (SIGKILL, a Ray node removed) leaves its run's cgroups: the
    processes died with the PID namespace, the directories pile up.  A live run's cgroup is
    empty only while its launcher spawns into it or removes it, never minutes after the
    time in its name."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(base)
    except OSError:
        return []
    gone = []
    for name in names:
        made = _run_time(name)
        if made is None or now - made < STALE_S:
            continue
        path = os.path.join(base, name)
        here = [os.path.join(path, child) for child in (PAYLOAD, INIT)
                if os.path.isdir(os.path.join(path, child))] + [path]
        procs = [_read(os.path.join(d, "cgroup.procs")) for d in here]
        if any(p is None or p.strip() for p in procs):
            continue  # processes in it, or unreadable: not a leftover
        with small.suppress(OSError):
            for d in here:
                os.rmdir(d)
            gone.append(name)
    return gone


def _sweep_now_and_then(base: str) -> None:
    """:func:`sweep_stale` ``base`` unless this process did in the last SWEEP_EVERY_S: a
    leftover waits STALE_S anyway, and listing the base at every run of a pool cost each
    run its share of three directory listings (issue 12)."""
    now = time.monotonic()
    if now - _swept.get(base, -SWEEP_EVERY_S) >= SWEEP_EVERY_S:
        _swept[base] = now
        sweep_stale(base)


def _run_time(name: str) -> float | None:
    """When the run called ``name`` (workspace.new_run_id: UTC stamp, dash, 8 hex) began."""
    stamp, dash, tail = name.partition("-")
    if not dash or len(tail) != 8 or any(c not in "0123456789abcdef" for c in tail):
        return None
    return _utc_seconds(stamp)


def _utc_seconds(stamp: str) -> float | None:
    """``YYYYmmddTHHMMSS`` as seconds since the epoch, what calendar.timegm(time.strptime(
    stamp, "%Y%m%dT%H%M%S")) gives for new_run_id's stamps, without strptime: it loads
    calendar, datetime and locale (~2-3 ms), and every run sweeps (tests/test_startup.py)."""
    if len(stamp) != 15 or stamp[8] != "T" or not (stamp[:8] + stamp[9:]).isdecimal() \
            or not stamp.isascii():
        return None
    y, m, d = int(stamp[:4]), int(stamp[4:6]), int(stamp[6:8])
    hh, mm, ss = int(stamp[9:11]), int(stamp[11:13]), int(stamp[13:15])
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    month_days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    if not (1 <= m <= 12 and 1 <= d <= month_days[m - 1] and hh <= 23 and mm <= 59
            and ss <= 61):
        return None
    # Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (the civil-from-
    # days inverse of H. Hinnant's date algorithms), as timegm counts them.
    y -= m <= 2
    era, yoe = divmod(y, 400)
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return float(days * 86400 + hh * 3600 + mm * 60 + ss)


# -- delegation (root, once) ----------------------------------------------------

def delegate(user: str, facts: HostFacts, undo: bool = False) -> list[str]:
    """Create (or remove) ``<v1 hierarchy>/corral/uid-<UID>`` for ``user``, owned by them.

    The user may then create run cgroups there and set their limits; the
    directory's own files stay root's, so whatever root puts in them bounds
    every run of that user.
    """
    if not facts.is_root:
        raise HostError("corral delegate must run as root",
                        "it hands a cgroup subtree to another user", "run it with sudo")
    try:
        entry = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
    except KeyError:
        raise HostError(f"user {user!r} is not known", "", "give an existing user") from None
    cg = facts.cgroups
    if not (cg.v1_mount("memory") or cg.v1_mount("pids")):
        raise HostError("this host has no cgroup v1 memory or pids hierarchy to delegate",
                        "on cgroup v2, moving a process needs rights over a common ancestor, "
                        "which a separate subtree cannot give",
                        "start corral inside a delegated cgroup: systemd-run --user --scope "
                        "corral ...")
    done = []
    for c in V1_CONTROLLERS:
        mount = cg.v1_mount(c)
        if mount is None:
            continue
        base = os.path.join(mount, "corral", f"uid-{entry.pw_uid}")
        if base in done:
            continue
        _undelegate(base) if undo else _delegate(base, entry.pw_uid, entry.pw_gid)
        done.append(base)
    return done


def _delegate(base: str, uid: int, gid: int) -> None:
    os.makedirs(base, 0o755, exist_ok=True)
    os.chown(base, uid, gid)


def _undelegate(base: str) -> None:
    with small.suppress(OSError):  # run cgroups a crashed run left behind, if empty
        for entry in os.scandir(base):
            if entry.is_dir(follow_symlinks=False):
                for child in (PAYLOAD, INIT):  # (a --cpus run's: see limits.PAYLOAD)
                    with small.suppress(FileNotFoundError):
                        os.rmdir(os.path.join(entry.path, child))
                os.rmdir(entry.path)
    try:
        os.rmdir(base)
    except FileNotFoundError:
        return
    except OSError as e:
        raise HostError(f"cannot remove {base}", e.strerror or str(e),
                        "wait for that user's runs to end, then try again") from None
