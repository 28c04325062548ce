"""The probe's two launches that run side by side never meet in the project they share."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import Identity

pytestmark = pytest.mark.sandbox


LATE_SPIN_RUNNER = """
import json, sys, threading, time
from corral.probe import launcher_for, launchers, probe
from corral.probe import run as probe_run
real_argv, real_execute, seen = launchers.Corral.argv, probe_run.execute, {}
def argv(self, spec, plant, config):  # the spin launch starts 3 s late, as under load
    words = real_argv(self, spec, plant, config)
    return ["/bin/sh", "-c", 'sleep 3; exec "$@"', "sh", *words] if spec.name == "spin" \\
        else words
class Noted:  # when the spin battery is seen to begin
    def __init__(self, event):
        self.event = event
    def set(self):
        seen.setdefault("spin begun", time.monotonic())
        self.event.set()
def execute(launcher, spec, plant, env, started=None):
    seen[spec.name] = time.monotonic()
    if spec.name == "spin":
        started = Noted(started)
    return real_execute(launcher, spec, plant, env, started)
launchers.Corral.argv, probe_run.execute = argv, execute
if sys.argv[1] == "unordered":  # the control: the main battery does not wait for the spin
    sequence, begun = probe_run._sequence, threading.Event()
    begun.set()
    probe_run._sequence = lambda run, specs, spin: sequence(run, specs, begun)
report = probe(launcher_for(None, None), ["writes-fifo-git", "resources-wall-clock"])
print(json.dumps({"main": seen["main"] - seen["spin begun"],
                  **{c.id: c.passed for c in report.checks}}))
"""


def test_the_main_battery_waits_for_the_spin_launch_to_begin(who: Identity) -> None:
    """The spin launch runs beside the main one, in the same project.  Under load its
    corral started after the main battery had left a FIFO named .git there, refused to
    start (exit 125), and two checks failed (seen in CI).  The main battery now begins
    only once the spin battery has.  Control: without the wait, the main battery begins
    while a spin launch that starts 3 s late is still being set up."""
    for mode in ("ordered", "unordered"):
        r = subprocess.run([*who.prefix(), "-c", LATE_SPIN_RUNNER, mode], env=who.environ(),
                           cwd=who.tmp, capture_output=True, text=True, timeout=300,
                           check=False)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["writes-fifo-git"] and got["resources-wall-clock"], got
        assert (got["main"] >= 0) == (mode == "ordered"), got
