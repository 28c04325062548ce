"""Launch cost: corral against raw bwrap with the same argv, paired in one run.

    .venv/bin/python bench/launch.py [--runs N] [--write]

Every measurement is a median over N rounds; within a round the variants
run back to back in a fixed order, so that a noisy neighbour hits them all
alike.  Three tables:

1. issue 2: ``corral run -- /bin/true`` (the CLI) and ``corral.run()`` (the
   API) against raw bwrap started through ``subprocess`` with the exact argv
   corral builds (corral's init included, so the difference is corral's own
   work).  Targets: API <= 1.10x, CLI <= 8x.
2. issue 5: the launcher with a memory+pids cgroup, without one, and raw
   bwrap.  Target: <= 1.3x raw bwrap.
3. how a cgroup is joined, on the bare seed recipe (bwrap ... /bin/true):
   the parent moving the child by pid through cgroup.procs (the child held
   before exec until it is moved), against the child writing 0 into the v1
   tasks files itself (what corral does); back to back, and 100 ms apart as
   separate runs are (a move right after another skips most of its cost).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from corral import api, cgroups, enforce, host
from corral.launch import Launch
from corral.limits import Plan
from corral.policy import Limits, Policy

Timer = Callable[[], float]
MiB = 1 << 20
SEED = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib",
        "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
        "--unshare-all", "--die-with-parent", "--new-session", "--", "/bin/true"]


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Corral:
    """The variants that go through corral, sharing one workspace and runs directory."""

    def __init__(self, base: Path, policy: Policy) -> None:
        self.facts = host.detect()
        self.policy = policy
        self.runs = base / "runs"
        self.ws = base / "ws"
        self.ws.mkdir()
        if self.facts.is_root:
            os.chown(self.ws, 65534, 65534)
        self.sb = api.plan(["/bin/true"], policy, workspace_dir=str(self.ws))
        self.bwrap = self.facts.require_bwrap()

    def _launch(self, **kwargs: object) -> Launch:
        return Launch(self.sb, capture=True, stdin=None, output_cap=MiB, timeout_s=60,
                      bwrap_path=self.bwrap, **kwargs)  # type: ignore[arg-type]

    def raw(self) -> float:
        """bwrap with corral's exact argv, through subprocess; building it is not timed."""
        run = self._launch()
        status_r, status_w = os.pipe()
        json_r, json_w = os.pipe()
        null = os.open(os.devnull, os.O_WRONLY)
        run.json_r = json_r  # the reader bwrap keeps (Launch.start makes it)
        me = os.pidfd_open(os.getpid())
        try:
            argv, keep = run.argv(status_w, json_w, null, me)
            return timed(lambda: subprocess.run(
                argv, pass_fds=keep, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env={}, check=True))
        finally:
            run.close()
            for fd in (status_r, status_w, json_r, json_w, null, me):
                os.close(fd)

    def api(self) -> float:
        return timed(lambda: api.run(["/bin/true"], self.policy, runs_dir=str(self.runs)))

    def cli(self, corral: str) -> float:
        env = {"PATH": os.environ["PATH"], "CORRAL_RUNS_DIR": str(self.runs),
               "HOME": os.environ.get("HOME", "/")}
        return timed(lambda: subprocess.run([corral, "run", "--", "/bin/true"], env=env,
                                            check=True))


class Placement:
    """Ways to put bwrap (seed recipe, /bin/true) in a fresh memory+pids cgroup."""

    def __init__(self, plan: Plan, bwrap: str) -> None:
        self.plan = plan
        self.argv = [bwrap, *SEED]
        self.n = 0

    def plain(self) -> float:
        return timed(lambda: subprocess.run(self.argv, check=True))

    def _with_cgroup(self, spawn: Callable[[cgroups.RunCgroup], subprocess.Popen[bytes]]
                     ) -> float:
        def go() -> None:
            self.n += 1
            cg = cgroups.RunCgroup(self.plan, f"bench-{os.getpid()}-{self.n}")
            cg.create()
            try:
                spawn(cg).wait()
            finally:
                cg.close()
        return timed(go)

    def by_pid(self) -> float:
        """The parent writes the child's pid into cgroup.procs while the child waits, before
        exec: moving it after it started would let it fork outside first."""
        def spawn(cg: cgroups.RunCgroup) -> subprocess.Popen[bytes]:
            pid_r, pid_w = os.pipe()
            go_r, go_w = os.pipe()

            def move() -> None:
                pid = os.read(pid_r, 32).decode()
                for d in cg.unique:
                    Path(d, "cgroup.procs").write_text(pid)
                os.write(go_w, b"x")

            def wait_to_be_moved() -> None:
                os.write(pid_w, str(os.getpid()).encode())
                os.read(go_r, 1)

            mover = threading.Thread(target=move)
            mover.start()
            try:  # Popen stays on this thread: bwrap's --die-with-parent follows the thread
                return subprocess.Popen(self.argv, preexec_fn=wait_to_be_moved)
            finally:
                mover.join()
                for fd in (pid_r, pid_w, go_r, go_w):
                    os.close(fd)
        return self._with_cgroup(spawn)

    def by_child(self) -> float:
        return self._with_cgroup(lambda cg: cg.spawn(
            lambda preexec: subprocess.Popen(self.argv, preexec_fn=preexec)))


def measure(variants: dict[str, Timer], runs: int, gap: float = 0.0) -> dict[str, float]:
    """Median seconds per variant, the variants interleaved round by round.

    ``gap`` seconds of rest before each sample, for costs that depend on how
    recently the kernel did the same (a cgroup move right after another is cheap).
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm caches once
        fn()
    for _ in range(runs):
        for name, fn in variants.items():
            time.sleep(gap)
            samples[name].append(fn())
    return {name: statistics.median(values) for name, values in samples.items()}


def table(title: str, medians: dict[str, float], base: str, targets: dict[str, float]
          ) -> list[str]:
    lines = [f"### {title}", "", "| variant | median | ratio to " + base + " | target |",
             "|---|---|---|---|"]
    for name, value in medians.items():
        ratio = value / medians[base]
        target = f"<= {targets[name]:.2f}x {'ok' if ratio <= targets[name] else 'MISSED'}" \
            if name in targets else ""
        lines.append(f"| {name} | {value * 1e3:.2f} ms | {ratio:.2f}x | {target} |")
    return [*lines, ""]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.machine())
    return (f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}, uid {os.geteuid()}")


def options(doc: str) -> argparse.Namespace:
    """``--runs N`` and ``--write``, for the benchmarks that replace their own section."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--write", action="store_true",
                        help="replace this script's section of bench/RESULTS.md")
    return parser.parse_args()


def main() -> None:
    args = options(__doc__)
    corral_cli = str(Path(sys.executable).with_name("corral"))
    limited = Policy(limits=Limits(memory_bytes=512 * MiB, pids=64))
    facts = host.detect()
    out = [f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}, "
           f"{args.runs} rounds.", ""]
    with scratch() as base:
        c = Corral(base, Policy())
        out += table("corral against raw bwrap, same argv (issue 2)", measure({
            "raw bwrap (subprocess)": c.raw, "corral.run() (API)": c.api,
            "corral run (CLI)": lambda: c.cli(corral_cli)}, args.runs),
            "raw bwrap (subprocess)", {"corral.run() (API)": 1.10, "corral run (CLI)": 8.0})
    try:
        plan = enforce.check(limited, facts)
    except Exception as e:  # a plain user without delegation: say so, skip the cgroup tables
        out.append(f"cgroup tables skipped: {e}")
        plan = None
    if plan is not None and plan.bases:
        with scratch() as base, scratch() as other:
            c = Corral(base, limited)
            bare = Corral(other, Policy())
            out += table("launch with a memory+pids cgroup (issue 5)", measure({
                "raw bwrap (subprocess)": c.raw,
                "corral.run(), no limits: no cgroup": bare.api,
                "corral.run(), memory+pids cgroup": c.api}, args.runs),
                "raw bwrap (subprocess)", {"corral.run(), memory+pids cgroup": 1.3})
        p = Placement(Plan(plan.version, tuple(b for b in plan.bases if b[0] != "cpuacct"),
                           plan.settings), facts.require_bwrap())
        variants = {"bwrap, no cgroup": p.plain, "cgroup, moved by pid": p.by_pid,
                    "cgroup, child joins (corral)": p.by_child}
        for gap, when in ((0.0, "back to back"), (0.1, "100 ms apart, as separate runs are")):
            out += table(f"joining the cgroup, seed recipe /bin/true, runs {when} "
                         "(mkdir, limits, rmdir included)", measure(variants, args.runs, gap),
                         "bwrap, no cgroup", {})
    print("\n".join(out))
    if args.write:
        from results import write_section

        write_section("launch.py", "## Launch cost (`bench/launch.py`)\n\n" + "\n".join(out))


if __name__ == "__main__":
    main()
