"""A reused workspace (``corral run --workspace W``) is one run's at a time.

Review 4: run B plants a git hook in W; run C starts in W while B lives, and its launch
census backs the plant up; B's audit quarantines it; C's payload touches the hook, and
C's audit "puts back the copy taken at launch", which is B's plant.  Host git then ran
it.  Now a run holds W (flock) from its census to its audit, and another refuses.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from conftest import Identity

pytestmark = pytest.mark.sandbox


def test_a_reused_workspace_takes_one_run_at_a_time(who: Identity) -> None:
    ws = who.chown(_made(who.tmp / "ws"))
    first = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--workspace", str(ws),
                              "--", "/bin/sh", "-c", ": > /work/started; sleep 30"],
                             env=who.environ(), cwd=who.tmp, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = who.corral("run", "--workspace", str(ws), "--", "/bin/true")
        assert second.returncode == 125, second
        assert "is in use by another corral run" in second.stderr, second.stderr
    finally:
        first.kill()
        first.communicate()
    # Control: once the first run is over, the workspace takes the next one.
    deadline = time.monotonic() + 60
    while (after := who.corral("run", "--workspace", str(ws), "--", "/bin/true")).returncode:
        assert time.monotonic() < deadline, after  # the killed launcher's sandbox ending
        time.sleep(0.5)


def _made(path: Path) -> Path:
    path.mkdir()
    return path
