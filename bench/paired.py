"""Command-line start-up, this checkout against another one, interleaved in one run.

    .venv/bin/python bench/paired.py OTHER_CHECKOUT [--runs N]

OTHER_CHECKOUT is a checkout of corral where ``make setup`` has run (its own venv and
compiled init), typically an earlier commit: ``git worktree add /tmp/old REV && make -C
/tmp/old setup``.  Each round runs ``corral run -- /bin/true`` and ``corral agent
-- /bin/true`` (generic: no proxy; claude: the egress proxy) from both checkouts, the
seed line and ``srt -- /bin/true`` (when installed), so that machine noise hits every
case alike; medians are printed as a table, with ratios to the seed line and to srt.
What a change did to start-up is read here, not across runs on different days.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import make_project
from seed import SEED, TRUE

HERE = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    base, home, project = make_project("corral-paired-")
    env = dict(os.environ, HOME=str(home))
    cases: dict[str, tuple[list[str], Path]] = {}
    for tag, root in ((args.other.name or str(args.other), args.other), ("this checkout", HERE)):
        corral = str(root / ".venv" / "bin" / "corral")
        agent = [corral, "agent", "--home", str(home)]
        cases[f"corral run -- /bin/true [{tag}]"] = ([corral, "run", "--", *TRUE], base)
        cases[f"corral agent generic [{tag}]"] = ([*agent, "--profile", "generic", "--",
                                                   *TRUE], project)
        cases[f"corral agent claude [{tag}]"] = ([*agent, "--profile", "claude", "--", *TRUE],
                                                 project)
    bwrap = shutil.which("bwrap") or "bwrap"
    cases["seed line"] = ([bwrap, *SEED, *TRUE], base)
    if shutil.which("srt"):
        cases["srt -- /bin/true"] = (["srt", "--", *TRUE], project)
    times: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for rnd in range(args.runs + 1):  # the first round warms caches, unmeasured
            for name, (cmd, cwd) in cases.items():
                start = time.perf_counter()
                done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr.decode()[-400:]}")
                if rnd:
                    times[name].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    srt = med.get("srt -- /bin/true")
    print(f"{args.runs} interleaved rounds, medians; load average {os.getloadavg()[0]:.1f}")
    print("| command | median ms | vs seed line | vs srt |\n|---|---:|---:|---:|")
    for name, m in med.items():
        vs_srt = f"{m / srt:.2f}x" if srt else "n/a"
        print(f"| {name} | {m * 1e3:.1f} | {m / med['seed line']:.1f}x | {vs_srt} |")


if __name__ == "__main__":
    main()
