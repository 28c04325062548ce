"""sweep_stale: the empty run cgroups a killed launcher left are removed, no others.

Every run sweeps its base, so the young names of its neighbours are set aside by a
string comparison before any date is parsed; the boundary is pinned here on real
cgroup v1 directories (root makes them; a plain user's runs sweep their delegated base
with the same code).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from corral import cgroups

ROOT = Path("/sys/fs/cgroup/pids")


def _name(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + "-0123abcd"


def test_only_empty_run_cgroups_past_the_threshold_go() -> None:
    if os.geteuid() != 0 or not ROOT.is_dir():
        pytest.skip("needs root and the cgroup v1 pids hierarchy")  # CI runs as root here
    base = ROOT / f"corral-sweep-test-{os.getpid()}"
    base.mkdir()
    now = float(int(time.time()))
    stale, edge, young, busy = (_name(now - cgroups.STALE_S), _name(now - cgroups.STALE_S + 1),
                                _name(now - 5), _name(now - 2 * cgroups.STALE_S))
    other = "not-a-run"
    for n in (stale, edge, young, busy, other):
        (base / n).mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (base / busy / "cgroup.procs").write_text(str(sleeper.pid))
        gone = cgroups.sweep_stale(str(base), now=now)
        assert gone == [stale]
        assert sorted(p.name for p in base.iterdir() if p.is_dir()) == sorted(
            [edge, young, busy, other])
        # Control: one second later the edge is stale too; the busy one never is.
        assert cgroups.sweep_stale(str(base), now=now + 1) == [edge]
    finally:
        sleeper.kill()
        sleeper.wait()
        for d in [p for p in base.iterdir() if p.is_dir()]:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        base.rmdir()
