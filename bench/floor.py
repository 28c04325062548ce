"""The launch floor (issue 12): corral against the seed document's plain bwrap line.

    .venv/bin/python bench/floor.py [--runs N] [--jobs N] [--write]

All in one run, interleaved round by round so that a noisy neighbour hits every
variant alike (medians; wall time and CPU time beside it):

1. one run at a time: the seed line running ``/bin/true`` (the floor); the same line
   with corral's own mounts and init argv, built by corral (no corral code timed); that
   line with ``/bin/true`` in place of the init; ``corral.run(["/bin/true"])`` with the
   CLI's default profile for it (``shell``: memory, pids and disk limits, so a cgroup)
   and with ``Policy()`` (no cgroup); ``corral run -- /bin/true``, the console script;
   each under both inits (``CORRAL_INIT``) when the compiled one is built;
2. where ``corral.run`` spends its time, phase by phase (host facts, checks, run
   directory, resolve, census, records, cgroup create/join/remove, bwrap until the
   sandbox's PID 1 exists, until the init reports "started", until the payload's end is
   reported, until bwrap is gone, collect);
3. a pool of 4 threads on the cores this machine has, runs per second, ``/bin/true`` and
   ``python3 -c 'print(1)'``, corral.run against the seed line;
4. ``corral agent -- /bin/true`` with the generic profile (no network: no proxy) and the
   claude profile (its model API allowed: the egress proxy starts), against sandbox-runtime's
   ``srt -- /bin/true`` when it is installed (``npm install -g @anthropic-ai/sandbox-runtime``;
   it needs ``apt-get install ripgrep socat``).

CPU time is getrusage: the launcher's own (RUSAGE_SELF) plus its reaped children's
(bwrap reaps the sandbox, so the children's figure covers every process of the run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section
from seed import SEED, TRUE

from corral import api, cgroups, cinit, host, launch
from corral.policy import Limits, Policy
from corral.profiles import load_profile

PY1 = ["/usr/bin/python3", "-c", "print(1)"]
Sample = tuple[float, float]  # wall s, CPU s


class CpuMeter:
    """CPU seconds of this process and everything it starts, however they are reaped.

    getrusage's children figure misses the sandbox (bwrap's PID 1 is not the launcher's
    child), so, as root with cgroup v1's cpuacct, this process moves into a cgroup of its
    own and reads its usage; a corral run with a cgroup of its own moves its sandbox out,
    and its Result's cpu_s (that cgroup's usage) is added by the caller.  Otherwise
    (a plain user) getrusage self + children, which undercounts: said in the output.
    """

    ROOT = "/sys/fs/cgroup/cpuacct"

    def __init__(self) -> None:
        self.dir = os.path.join(self.ROOT, f"floor-bench-{os.getpid()}")
        self.exact = os.geteuid() == 0 and os.path.isdir(self.ROOT)
        if self.exact:
            os.makedirs(self.dir, exist_ok=True)
            Path(self.dir, "cgroup.procs").write_text(str(os.getpid()))
        self.extra = 0.0  # sandbox CPU counted in runs' own cgroups
        self.lock = threading.Lock()

    def add(self, seconds: float | None) -> None:
        with self.lock:
            self.extra += seconds or 0.0

    def __call__(self) -> float:
        if self.exact:
            return int(Path(self.dir, "cpuacct.usage").read_text()) / 1e9 + self.extra
        s = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + self.extra

    def close(self) -> None:
        if self.exact:
            Path(self.ROOT, "cgroup.procs").write_text(str(os.getpid()))
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)


cpu = CpuMeter()


def sample(fn: Callable[[], object]) -> Sample:
    c, t = cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t, cpu() - c


@contextlib.contextmanager
def init_env(which: str | None) -> Iterator[None]:
    old = os.environ.get("CORRAL_INIT")
    if which is not None:
        os.environ["CORRAL_INIT"] = which
    try:
        yield
    finally:
        os.environ.pop("CORRAL_INIT", None)
        if old is not None:
            os.environ["CORRAL_INIT"] = old


class Variants:
    def __init__(self, base: Path) -> None:
        self.facts = host.detect()
        self.bwrap = self.facts.require_bwrap()
        self.base = str(base)
        self.runs = str(base / "runs")
        self.shell = load_profile("shell")  # what `corral run -- /bin/true` gets
        # The default policy with cgroup limits: memory and processes, no disk limit (as
        # root, a disk limit gives the workspace a file system of its own: the shell
        # profile's row shows that too).
        self.limited = Policy(limits=Limits(memory_bytes=512 << 20, pids=64))
        self.cli_path = str(Path(sys.executable).with_name("corral"))

    def seed(self, cmd: list[str] = TRUE) -> None:
        subprocess.run([self.bwrap, *SEED, *cmd], stdout=subprocess.DEVNULL, check=True)

    def api(self, policy: Policy, cmd: list[str] = TRUE) -> None:
        r = api.run(cmd, policy, runs_dir=self.runs)
        assert r.ok, (r.status, r.stderr)
        cpu.add(r.cpu_s)

    def cli(self) -> None:
        env = {"PATH": os.environ["PATH"], "CORRAL_RUNS_DIR": self.runs,
               "HOME": os.environ.get("HOME", "/"), **_init_var()}
        out = subprocess.run([self.cli_path, "run", "--json", "--", "/bin/true"], env=env,
                             check=True, capture_output=True).stdout
        cpu.add(json.loads(out)["cpu_s"])

    def corral_argv(self, no_init: bool, which: str | None = None) -> Callable[[], None]:
        """bwrap with corral's mounts and init, built beforehand; only bwrap is timed."""
        ws = tempfile.mkdtemp(prefix="floor-ws-", dir=self.base)
        if self.facts.is_root:
            os.chown(ws, 65534, 65534)
        with init_env(which):
            sb = api.plan(TRUE, Policy(), workspace_dir=ws)

        def go() -> None:
            run = launch.Launch(sb, capture=True, stdin=None, output_cap=1 << 20, timeout_s=60,
                                bwrap_path=self.bwrap)
            fds = [os.open(os.devnull, os.O_WRONLY) for _ in range(4)]
            run.json_r = fds[3]  # the reader bwrap keeps (Launch.start makes a pipe)
            me = os.pidfd_open(os.getpid())
            fds.append(me)
            try:
                argv, keep = run.argv(*fds[:3], me)
                if no_init:
                    argv = argv[:argv.index("--") + 1] + TRUE
                subprocess.run(argv, pass_fds=keep, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={},
                               check=True)
            finally:
                run.close()
                for fd in fds:
                    os.close(fd)
        return go


def _init_var() -> dict[str, str]:
    which = os.environ.get("CORRAL_INIT")
    return {"CORRAL_INIT": which} if which else {}


def interleave(variants: dict[str, Callable[[], object]], runs: int) -> dict[str, Sample]:
    got: dict[str, list[Sample]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm caches
    for _ in range(runs):
        for name, fn in variants.items():
            got[name].append(sample(fn))
    return {name: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
            for name, v in got.items()}


class Phases:
    """Wall time per phase of corral.run, by wrapping the functions it calls, and the
    launcher's own CPU time in it (its thread's: what a pool of launchers shares the
    cores with, beside the sandbox's bwrap, init and payload)."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}
        self.runs: list[dict[str, float]] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: object, attr: str, name: str) -> None:
        real = getattr(owner, attr)
        now = self.now

        def timed(*args: object, **kwargs: object) -> object:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                now[name] = now.get(name, 0.0) + time.perf_counter() - t
                now["%" + name] = now.get("%" + name, 0.0) + time.thread_time() - c
        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, real))

    def mark(self, name: str) -> None:
        self.now.setdefault("@" + name, time.perf_counter())

    def __enter__(self) -> Phases:
        for owner, attr, name in (
                (api.host, "detect", "host facts"),
                (api.enforce, "check", "policy checks (limits plan)"),
                (api, "_check_network", "policy checks (network)"),
                (api, "prepare", "run directory"),
                (api.resolve, "resolve_run", "resolve"),
                (api.audit, "Census", "census"), (api.audit, "census_of_tree", "census"),
                (api.workspace, "write_record", "record writes"),
                (api.workspace, "collect", "collect"),
                (api, "_stage", "disk image: create, inputs"),
                (api.enforce, "release_image", "disk image: copy out, release"),
                (cgroups.RunCgroup, "create", "cgroup create"),
                (cgroups.RunCgroup, "close", "cgroup read and remove"),
                (launch.Launch, "argv", "bwrap argv and memfds"),
                (launch.Launch, "start", "spawn bwrap (includes argv, cgroup join)")):
            self.wrap(owner, attr, name)
        real_adopt, real_events = launch.Launch._adopt_pid1, launch.Launch._events
        phases = self

        def adopt(run: launch.Launch, pid: int) -> None:
            phases.mark("pid1")
            real_adopt(run, pid)

        def events(run: launch.Launch, fd: int, buf: bytearray) -> None:
            real_events(run, fd, buf)
            for e in run.outcome.events:
                phases.mark(str(e.get("event")))
        launch.Launch._adopt_pid1 = adopt  # type: ignore[method-assign]
        launch.Launch._events = events  # type: ignore[method-assign]
        self._undo += [lambda: setattr(launch.Launch, "_adopt_pid1", real_adopt),
                       lambda: setattr(launch.Launch, "_events", real_events)]
        self.wrap(launch.Launch, "supervise", "supervise")
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()

    def one(self, fn: Callable[[], object]) -> None:
        self.now.clear()
        t0, c0 = time.perf_counter(), time.thread_time()
        self.now["@begin"] = t0
        fn()
        self.now["total"] = time.perf_counter() - t0
        self.now["%total"] = time.thread_time() - c0
        self.runs.append(dict(self.now))

    def table(self) -> list[str]:
        med = {k: statistics.median(r.get(k, 0.0) for r in self.runs)
               for k in self.runs[0] if not k.startswith(("@", "%"))}
        own = {k: statistics.median(r.get("%" + k, 0.0) for r in self.runs) for k in med}
        rel: dict[str, list[float]] = {}
        for r in self.runs:  # the sandbox's own life, from the supervise marks
            s = r.get("@pid1")
            if s is None or "@started" not in r or "@exited" not in r:
                continue
            rel.setdefault("spawn to PID 1 (bwrap: clone, namespaces)", []).append(
                s - r["@begin"])
            rel.setdefault("PID 1 to \"started\" (mounts, init start, checks, payload exec)",
                           []).append(r["@started"] - s)
            rel.setdefault("\"started\" to \"exited\" (payload)", []).append(
                r["@exited"] - r["@started"])
        lines = ["| phase | median ms | launcher CPU ms |", "|---|---:|---:|"]
        for k, v in med.items():
            lines.append(f"| {k} | {v * 1e3:.2f} | {own[k] * 1e3:.2f} |")
        lines += ["", "Inside the launch, from the pipe events (absolute from the call's start "
                  "for the first):", "", "| interval | median ms |", "|---|---:|"]
        for k, vs in rel.items():
            lines.append(f"| {k} | {statistics.median(vs) * 1e3:.2f} |")
        return lines


def pool_rate(fn: Callable[[], object], threads: int, jobs: int) -> Sample:
    """Runs per second with ``threads`` threads, and CPU seconds per run."""
    c, t = cpu(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: fn(), range(jobs)))
    wall = time.perf_counter() - t
    return jobs / wall, (cpu() - c) / jobs


def one_run_table(v: Variants, runs: int, inits: list[str | None]) -> list[str]:
    variants: dict[str, Callable[[], object]] = {
        "seed line, /bin/true (the floor)": v.seed,
        "bwrap, corral's argv, /bin/true instead of the init": v.corral_argv(True),
    }
    for which in inits:
        tag = f" [{which} init]" if which else ""

        def under(fn: Callable[[], object], w: str | None = which) -> Callable[[], object]:
            def go() -> object:
                with init_env(w):
                    return fn()
            return go
        variants[f"bwrap, corral's argv with its init{tag}"] = v.corral_argv(False, which)
        variants[f"corral.run, Policy() (no limits){tag}"] = under(lambda: v.api(Policy()))
        variants[f"corral.run, memory+pids (cgroup){tag}"] = under(lambda: v.api(v.limited))
        variants[f"corral.run, shell profile (cgroup, disk){tag}"] = under(
            lambda: v.api(v.shell))
        variants[f"corral run -- /bin/true (CLI){tag}"] = under(v.cli)
    got = interleave(variants, runs)
    floor = got["seed line, /bin/true (the floor)"]
    lines = ["| variant | wall ms | ratio | CPU ms per run | CPU ratio |",
             "|---|---:|---:|---:|---:|"]
    for name, (wall, cpu_s) in got.items():
        lines.append(f"| {name} | {wall * 1e3:.2f} | {wall / floor[0]:.2f}x | "
                     f"{cpu_s * 1e3:.2f} | {cpu_s / floor[1]:.2f}x |")
    return lines


def pool_table(v: Variants, jobs: int, which: str | None) -> list[str]:
    lines = ["| work | seed-line pool runs/s | CPU ms/run | corral.run pool runs/s | "
             "CPU ms/run | ratio |", "|---|---:|---:|---:|---:|---:|"]
    python = load_profile("python")
    cases = (("/bin/true", TRUE, v.limited, "memory+pids"),
             ("/bin/true", TRUE, v.shell, "shell profile"),
             ("python3 -c 'print(1)'", PY1, v.limited, "memory+pids"),
             ("python3 -c 'print(1)'", PY1, python, "python profile"))
    with init_env(which):
        for name, cmd, policy, label in cases:
            v.api(policy, cmd)
            raws, ours = [], []
            for _ in range(3):  # interleaved thirds
                raws.append(pool_rate(lambda c=cmd: v.seed(c), 4, jobs // 3))
                ours.append(pool_rate(lambda c=cmd, p=policy: v.api(p, c), 4, jobs // 3))
            raw = statistics.median(r[0] for r in raws), statistics.median(r[1] for r in raws)
            our = statistics.median(r[0] for r in ours), statistics.median(r[1] for r in ours)
            lines.append(f"| `{name}`, {label} | {raw[0]:.0f} | {raw[1] * 1e3:.1f} | "
                         f"{our[0]:.0f} | {our[1] * 1e3:.1f} | {our[0] / raw[0]:.2f}x |")
    return lines


def agent_table(runs: int, which: str | None) -> list[str]:
    """corral agent start-up against srt, interleaved (bench/agent.py's cases)."""
    from agent import interleaved, make_project, timed

    base, home, project = make_project("corral-floor-agent-")
    env = {**os.environ, "HOME": str(home), **({"CORRAL_INIT": which} if which else {})}
    corral = [str(Path(sys.executable).with_name("corral")), "agent", "--home", str(home)]
    cases: dict[str, Callable[[], float]] = {
        "corral agent, generic (no proxy)":
            lambda: timed([*corral, "--profile", "generic", "--", "/bin/true"], project, env),
        "corral agent, claude (egress proxy)":
            lambda: timed([*corral, "--profile", "claude", "--", "/bin/true"], project, env)}
    srt = shutil.which("srt")
    if srt:
        cases["srt -- /bin/true"] = lambda: timed([srt, "--", "/bin/true"], project, env)
    try:
        times = interleaved(cases, runs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ref = med.get("srt -- /bin/true")
    lines = ["| command | median ms | vs srt |", "|---|---:|---:|"]
    lines += [f"| `{k}` | {v:.1f} | {f'{v / ref:.2f}x' if ref else 'n/a'} |"
              for k, v in med.items()]
    if ref is None:
        lines += ["", "srt is not installed here: no ratio."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=240, help="runs per pool measurement")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    inits: list[str | None] = ["c", "python"] if cinit.available() else [None]
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="corral-floor-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        v = Variants(base)
        out = [f"## The launch floor (`bench/floor.py`, {time.strftime('%Y-%m-%d %H:%M %Z')})",
               "", f"{args.runs} interleaved rounds, medians; {os.cpu_count()} cores; as "
               f"{'root' if v.facts.is_root else 'a plain user'}; load average "
               f"{load_before[0]:.1f} at the start; CPU time "
               f"{'from cpuacct cgroups' if cpu.exact else 'from getrusage (misses the sandbox)'}"
               ".", "",
               "### One run at a time, against the seed line", "",
               *one_run_table(v, args.runs, inits), ""]
        for which in inits:
            for label, policy in (("memory+pids", v.limited), ("shell profile", v.shell)):
                with init_env(which), Phases() as ph:
                    for _ in range(args.runs):
                        ph.one(lambda p=policy: v.api(p))
                out += [f"### Where corral.run spends its time ({label}, "
                        f"{which or 'default'} init)", "", *ph.table(), ""]
        for which in inits:
            out += [f"### Pools of 4 threads ({args.jobs} runs each, {which or 'default'} init)",
                    "", *pool_table(v, args.jobs, which), ""]
        for which in inits:
            out += [f"### Agent start-up ({max(args.runs // 2, 5)} interleaved runs, "
                    f"{which or 'default'} init)", "",
                    *agent_table(max(args.runs // 2, 5), which), ""]
        out.append(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        cpu.close()
    text = "\n".join(out)
    print(text)
    if args.write:
        write_section("floor.py", text)


if __name__ == "__main__":
    main()
