"""Agent start-up: ``corral agent -- /bin/true`` against sandbox-runtime's ``srt -- /bin/true``.

Issue 3's target: corral's agent start-up at most one third of srt's time,
with and without the egress proxy (the generic profile allows no name, so
no proxy starts; the claude profile allows its model API, so one does).
Both tools run from the same project directory, interleaved in the same
run, so machine noise hits both alike.
Results go to bench/RESULTS.md between this script's markers.

    .venv/bin/python bench/agent.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from results import write_section


def timed(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def interleaved(cases: dict[str, Callable[[], float]], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():  # warm caches once each
        case()
    for _ in range(runs):
        for name, case in cases.items():
            times[name].append(case())
    return times


def make_project(prefix: str) -> tuple[Path, Path, Path]:
    """A scratch base with a home and a project in it (owned by nobody as root: corral
    runs an agent as the project's owner, never as root)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    home, project = base / "home", base / "home" / "dev" / "proj"
    project.mkdir(parents=True)
    (project / "README.md").write_text("bench\n")
    if os.geteuid() == 0:
        for p in [base, *base.rglob("*")]:
            os.chown(p, 65534, 65534)
    return base, home, project


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    base, home, project = make_project("corral-bench-agent-")
    env = {**os.environ, "HOME": str(home)}
    # The console script, as users start it (python -m corral would add runpy's cost).
    corral = [str(Path(sys.executable).with_name("corral")), "agent", "--home", str(home)]
    cases: dict[str, Callable[[], float]] = {
        "corral agent (generic: no network)":
            lambda: timed([*corral, "--profile", "generic", "--", "/bin/true"], project, env),
        # The claude profile allows its model API: the egress proxy and bridge start too.
        "corral agent (claude: egress proxy)":
            lambda: timed([*corral, "--profile", "claude", "--", "/bin/true"], project, env),
    }
    srt = shutil.which("srt")
    if srt:
        cases["srt -- /bin/true"] = lambda: timed([srt, "--", "/bin/true"], project, env)
    try:
        times = interleaved(cases, args.runs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    medians = {name: statistics.median(ts) * 1000 for name, ts in times.items()}
    lines = [f"## Agent start-up (`bench/agent.py`, {time.strftime('%Y-%m-%d')})", "",
             f"{args.runs} interleaved runs each, medians, on {os.cpu_count()} cores, "
             f"as {'root' if os.geteuid() == 0 else 'a plain user'}.", "",
             "| command | median ms | vs srt |", "|---|---:|---:|"]
    ref = medians.get("srt -- /bin/true")
    for name, ms in medians.items():
        ratio = f"{ms / ref:.2f}x" if ref else "n/a"
        lines.append(f"| `{name}` | {ms:.1f} | {ratio} |")
    if ref is None:
        lines += ["", "srt is not installed here (`npm install -g @anthropic-ai/sandbox-runtime`, "
                  "plus `ripgrep` and `socat`), so there is no ratio."]
    else:
        lines += ["", f"Target: at most 1/3 of srt's time ({ref / 3:.1f} ms)."]
        for name in ("corral agent (generic: no network)", "corral agent (claude: egress proxy)"):
            mine = medians[name]
            verdict = "meets" if mine <= ref / 3 else "misses"
            lines.append(f"- `{name}` {verdict} it ({mine / ref:.2f}x).")
    text = "\n".join(lines) + "\n"
    print(text)
    write_section("agent.py", text)


if __name__ == "__main__":
    main()
