"""Running the probe: plant, launch, verify the host, judge, clean up.

Two threads share the work, so the probe takes seconds: one runs the spin
launch (it waits for the sandbox's wall clock) in a project of its own (corral
lets no two sandboxes write one tree); the other, once the spin battery has
begun, runs the main launch, then each launch-directory launch, then each
resource launch, one after another.
After every launch the host is verified at once (planted files, canary
servers, marked processes) and what it changed is put back,
so that every launch is judged on its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import difflib
import glob
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Iterable, Sequence

from ..errors import UsageError
from .canaries import Plant, Site, processes_with
from .catalogue import CATALOGUE, EXIT_CODE, LAUNCH_DIRS, SPIN_S
from .checks import CATEGORIES, Check, Seen
from .launchers import Launcher, LaunchSpec, execute, launch_env
from .report import CheckResult, Report

__all__ = ["probe", "select"]

DEADLINE_S = {"main": 60.0, "resource": 60.0, "launch": 30.0, "spin": SPIN_S + 6.0,
              "venv": 30.0, "planted": 30.0}
LAUNCH_ENV = {"venv": (("VIRTUAL_ENV", "{venv}"),),  # the planted ones (see probe.hostside)
              "planted": (("PATH", "{probe_bin}:$PATH"),)}
ORDER = ("main", "launch", "venv", "planted", "resource")
ATTEMPT_ORDER = ("secrets", "network", "privilege", "writes", "resources", "lifecycle", "launch")
SURVIVOR_GRACE_S = 0.5  # a PID namespace being torn down may take a moment to empty


def select(only: Sequence[str] = ()) -> tuple[Check, ...]:
    """The checks named by id or category; all of them when ``only`` is empty."""
    if not only:
        return CATALOGUE
    known = {c.id for c in CATALOGUE} | set(CATEGORIES)
    for name in only:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise UsageError(f"--check {name} names no check or category",
                             f"did you mean {close[0]!r}?" if close else
                             f"categories: {', '.join(CATEGORIES)}",
                             "see docs/probe.md for the list")
    return tuple(c for c in CATALOGUE if c.id in only or c.category in only)


def _kind(launch: str) -> str:
    return launch.split("-", 1)[0] if launch.startswith(("resource", "launch")) else launch


def plan(checks: Iterable[Check], plant: Plant) -> dict[str, LaunchSpec]:
    """The launches that ``checks`` need, each with its attempts in catalogue order."""
    by_launch: dict[str, list[Check]] = {}
    for c in checks:
        by_launch.setdefault(c.launch, []).append(c)
    if "spin" in by_launch:  # the spinner is the attempt that the spin checks judge
        by_launch["spin"] = [c for c in CATALOGUE if c.launch == "spin"]
    specs = {}
    for name, members in by_launch.items():
        kind = _kind(name)
        # Reads before writes: a write that fails on the host may still create a directory
        # in a scratch home inside the sandbox, which a later listing would then see.
        members.sort(key=lambda c: ATTEMPT_ORDER.index(c.category))
        attempts = tuple(a.render(ident, plant) for c in members
                         for ident, a in zip(c.attempt_ids(), c.attempts, strict=True))
        cwd = plant.fill(LAUNCH_DIRS[name]) if kind == "launch" else \
            plant.spin_project if kind == "spin" else plant.project
        env = tuple((k, plant.fill(v)) for k, v in LAUNCH_ENV.get(kind, ()))
        specs[name] = LaunchSpec(name, kind, cwd, attempts, DEADLINE_S[kind],
                                 exit=EXIT_CODE if kind == "main" else 0,
                                 terminal=kind == "main", env=env)
    return specs


class Run:
    """One probe run: the site, the launcher, and what each launch showed."""

    def __init__(self, launcher: Launcher, site: Site, plant: Plant, checks: Sequence[Check],
                 env: dict[str, str]) -> None:
        self.launcher, self.site, self.plant, self.env = launcher, site, plant, env
        self.checks = checks
        self.seen: dict[str, Seen] = {}
        self.sessions: list[int] = []

    def launch(self, spec: LaunchSpec, started: threading.Event | None = None) -> None:
        outcome = execute(self.launcher, spec, self.plant, self.env, started)
        if outcome.session is not None:
            self.sessions.append(outcome.session)
        for c in self.checks:
            if c.launch == spec.name:
                findings, notes = self.verify(c)
                self.seen[c.id] = Seen(c, self.plant, outcome, findings,
                                       self.launcher.refuses_unsafe, notes)
        for c in self.checks:
            if c.launch == spec.name:
                for w in c.watches:
                    if w.kind in ("unchanged", "absent"):
                        self.site.restore(self.plant.fill(w.target))

    def verify(self, c: Check) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What the host shows after the launch: problems, and plain observations."""
        found, notes = [], []
        for w in c.watches:
            if w.kind in ("unchanged", "absent"):
                change = self.site.changed(self.plant.fill(w.target))
                found += [change] if change else []
            elif w.kind == "unreached":
                peers = self.site.listeners.seen(w.target)
                found += [f"the {w.target} canary was reached {len(peers)} time(s)"] if peers \
                    else []
            elif w.kind == "owner":
                owners = [st.st_uid for st in _made(self.plant, self.plant.fill(w.target))]
                found += ["its file is owned by uid 0 on the host"] if 0 in owners else []
                notes += [f"its file is owned by uid {', '.join(map(str, sorted(set(owners))))}"
                          " on the host" if owners else "its file is nowhere on the host"]
            elif w.kind == "setid":
                modes = [st.st_mode for st in _made(self.plant, self.plant.fill(w.target))]
                found += [f"its file has mode {m & 0o7777:04o} on the host" for m in modes
                          if m & (stat.S_ISUID | stat.S_ISGID)]
            else:
                pids = _survivors(f"{self.plant.tag}-{w.target}")
                found += [f"still running: pid {', '.join(map(str, pids))}"] if pids else []
        return tuple(found), tuple(notes)


def _made(plant: Plant, name: str) -> list[os.stat_result]:
    """What the battery made in its working directory, found on the host: in the project,
    or in a corral run workspace under the probe's runs directory."""
    places = [os.path.join(plant.project, name),
              *glob.glob(os.path.join(plant.places()["runs"], "*", "work", name))]
    found = []
    for path in places:
        with contextlib.suppress(OSError):
            found.append(os.lstat(path))
    return found


def _survivors(marker: str) -> list[int]:
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    while (pids := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _sequence(run: Run, specs: dict[str, LaunchSpec], spin: threading.Event) -> None:
    # The spin launch is set up (scanned, mounted) before the main battery plants anything:
    # when it shared the project, a FIFO named .git there made it refuse to start.
    spin.wait(DEADLINE_S["spin"])
    order = sorted((n for n in specs if n != "spin"), key=lambda n: ORDER.index(specs[n].kind))
    for name in order:
        run.launch(specs[name])


def probe(launcher: Launcher, only: Sequence[str] = (), base_dir: str | None = None,
          env: dict[str, str] | None = None) -> Report:
    """Audit ``launcher``: plant canaries, run the battery under it, judge every check.

    ``env`` is the launcher's environment before the canaries are added (default:
    this process's).  Everything planted is removed before this returns.
    """
    checks = select(only)
    started = time.monotonic()
    site = Site(base_dir)
    sessions: list[int] = []
    try:
        plant = site.open()
        site.remember(plant.fill(w.target) for c in checks for w in c.watches
                      if w.kind in ("unchanged", "absent"))
        specs = plan(checks, plant)
        run = Run(launcher, site, plant, checks, launch_env(plant, env))
        sessions = run.sessions
        spin = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(_sequence, run, specs, spin)]
            if "spin" in specs:
                jobs.append(pool.submit(run.launch, specs["spin"], spin))
            else:
                spin.set()
            for job in jobs:
                job.result()
        results = tuple(_judge(c, run.seen.get(c.id), plant) for c in checks)
    finally:
        for session in sessions:  # what a launcher left in its own session
            with contextlib.suppress(OSError):
                os.killpg(session, signal.SIGKILL)
        site.close()
    return Report(launcher.name, results, time.monotonic() - started, site.run)


def _judge(c: Check, seen: Seen | None, plant: Plant) -> CheckResult:
    passed, observed = (False, "not run") if seen is None else c.judge(seen)
    for path, name in ((plant.home, "~"), (plant.root, "<probe>")):  # readable, and stable
        observed = re.sub(r"(?<![\w/])" + re.escape(path) + r"(?![\w-])", name, observed)
    return CheckResult(c.id, c.category, c.attempted, c.expected, observed, passed)
