"""How long ``corral probe`` takes, under corral and under the launchers it compares.

The whole probe waits for the spin launch (corral's --timeout 2; a launcher
without a wall clock lets the spinner run its own 5 s), so it is also timed
without that launch, which is the cost of the canaries, the battery's 80-odd
other attempts, and their host-side checks.  Interleaved runs, medians;
results go to bench/RESULTS.md between this script's markers.

    .venv/bin/python bench/probe.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN, END = "<!-- bench/probe.py:begin -->", "<!-- bench/probe.py:end -->"
WITHOUT_SPIN = [f"--check={c}" for c in ("writes", "secrets", "network", "privilege", "launch",
                                         "lifecycle-daemon", "lifecycle-orphan",
                                         "lifecycle-exit-status", "resources-open-files",
                                         "resources-file-size")]
CASES = {
    "corral (generic), whole probe": [],
    "corral (generic), without the spin launch": WITHOUT_SPIN,
    "corral (claude: egress proxy), whole probe": ["--profile", "claude"],
    "naive, whole probe": ["--launcher", "naive"],
    "naive, without the spin launch": ["--launcher", "naive", *WITHOUT_SPIN],
    "none, whole probe": ["--launcher", "none"],
}


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "corral", "probe", "--json", *args],
                   stdout=subprocess.DEVNULL, check=False, cwd="/")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(runs):
        for name, args in CASES.items():
            times[name].append(timed(args))
    lines = [BEGIN, f"## Probe wall time (`bench/probe.py`, {time.strftime('%Y-%m-%d')})", "",
             f"{runs} interleaved runs each, medians, on {os.cpu_count()} cores, as "
             f"{'root' if os.geteuid() == 0 else 'a plain user'}.", "",
             "| launcher | median s |", "|---|---:|"]
    lines += [f"| {name} | {statistics.median(t):.2f} |" for name, t in times.items()]
    lines.append(END)
    section = "\n".join(lines)
    print(section)
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text:
        text = text.split(BEGIN)[0] + section + text.split(END)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
