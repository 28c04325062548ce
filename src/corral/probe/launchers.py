"""Launchers: how the battery is started under the sandbox being audited.

* :class:`Corral` runs the battery under corral itself (``corral agent`` for agent
  profiles, ``corral run`` for ``python``, ``node`` and ``shell``), passing the
  fake home as ``--home`` and, for the launches that need them, limits.
* :class:`Prefix` runs ``PREFIX... python3 BATTERY LAUNCH CONFIG`` for any other
  sandbox command; ``$PWD`` and ``$HOME`` in its words become the launch
  directory and the fake home.  Built in: ``naive`` (the seed's first
  sandbox) and ``none`` (no sandbox: the negative control).

Every launch goes through a small trampoline on the host that, before it
execs the launcher: starts a new session (so the probe can kill the whole
launch), makes the probe's own pseudo-terminal the controlling terminal
(never the user's: terminal injection is attempted), joins a fresh session
keyring holding the keyring canary, and leaves the inherited-descriptor
canary open.  :func:`execute` runs one launch with the probe's own deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from .canaries import BATTERY, Plant

__all__ = ["NAIVE", "Corral", "LaunchSpec", "Outcome", "Prefix", "execute", "launcher_for"]

TAG = b"@@corral-probe@@ "
RUN_PROFILES = ("python", "node", "shell")
# corral's flags for the resource launches: the limits the probe asks for and then tests.
RESOURCE_FLAGS = ("--memory", "256M", "--pids", "128", "--disk", "256M")
SPIN_TIMEOUT_S = 2
NAIVE = "bwrap --ro-bind / / --bind $PWD $PWD --unshare-pid --tmpfs /tmp"
DRAIN_S = 1.0  # after the launcher exits, how long leftovers may hold its pipes open
TRAMPOLINE = r"""
import ctypes, os, platform, sys
env = os.environ
key, held = env.pop("CORRAL_PROBE_KEY", ""), env.pop("CORRAL_PROBE_HOLD", "")
status = int(env.pop("CORRAL_PROBE_STATUS_FD"))
notes = []
os.setsid()
if os.isatty(0):
    import fcntl, termios
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    notes.append("terminal")
if key:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
    desc, payload = key.encode().split(b"\n", 1)
    L = ctypes.c_long
    if (nr and libc.syscall(L(nr[1]), L(1), None) >= 0
            and libc.syscall(L(nr[0]), b"user", desc, payload, L(len(payload)), L(-3)) >= 0):
        notes.append("keyring")
    else:
        notes.append("no-keyring:" + os.strerror(ctypes.get_errno()).replace(" ", "-"))
if held:
    os.set_inheritable(os.open(held, os.O_RDONLY), True)
os.write(status, (" ".join(notes) + "\n").encode())
os.close(status)
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as e:
    sys.stderr.write(f"cannot start {sys.argv[1]}: {e.strerror}\n")
    os._exit(127)
"""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One start of the battery: which attempts, from where, with which deadline."""

    name: str  # main, spin, resource-memory, launch-home, venv, planted ...
    kind: str  # main, resource, spin, launch, venv, planted
    cwd: str
    attempts: tuple[dict[str, Any], ...]
    deadline_s: float
    exit: int = 0
    terminal: bool = False  # stdin is the probe's pseudo-terminal
    env: tuple[tuple[str, str], ...] = ()  # more for the launcher ($PATH: the launcher's own)


@dataclass(frozen=True, slots=True)
class Corral:
    """corral itself, with a shipped profile or a profile file."""

    profile: str = "generic"
    refuses_unsafe: bool = True  # launched from home or /, it must refuse (exit 125)
    allow: tuple[str, ...] = ()  # relaxations the user named (--allow), passed on
    # False: the profile forbids unix sockets, so the probe's datagram socket is made
    # visible (--ro) and the system-call filter, not the mount view, must stop it.
    unix_sockets: bool = True

    @property
    def name(self) -> str:
        relaxed = "".join(f" --allow {a}" for a in self.allow)
        return f"corral {self.mode} --profile {self.profile}{relaxed}"

    @property
    def mode(self) -> str:
        return "run" if self.profile in RUN_PROFILES else "agent"

    def argv(self, spec: LaunchSpec, plant: Plant, config: str) -> list[str]:
        p = plant.places()
        words = [sys.executable, "-m", "corral", self.mode, "--profile", self.profile,
                 "--runs-dir", p["runs"], *(w for a in self.allow for w in ("--allow", a))]
        if self.mode == "agent":
            words += ["--home", plant.home]
        if spec.kind == "resource":
            words += RESOURCE_FLAGS
        if spec.kind == "spin":
            words += ["--timeout", str(SPIN_TIMEOUT_S)]
        if self.mode == "run" and spec.kind == "launch":
            words += ["--workspace", spec.cwd]  # corral run's equivalent of a launch directory
        battery = plant.battery if spec.kind == "launch" else BATTERY
        if self.mode == "run" and spec.kind != "launch":
            words += ["--input", plant.battery]
        if self.mode == "run" and spec.kind == "main" and not self.unix_sockets:
            words += ["--ro", os.path.dirname(p["dgram_sock"])]
        return [*words, "--", "python3", battery, spec.name, config]


@dataclass(frozen=True, slots=True)
class Prefix:
    """Any other sandbox command: its words, then ``python3 BATTERY LAUNCH CONFIG``."""

    name: str
    words: tuple[str, ...] = field(default=())
    refuses_unsafe: bool = False

    def argv(self, spec: LaunchSpec, plant: Plant, config: str) -> list[str]:
        fill = {"$PWD": spec.cwd, "${PWD}": spec.cwd, "$HOME": plant.home, "${HOME}": plant.home}
        words = [fill.get(w, w) for w in self.words]
        battery = plant.battery if spec.kind == "launch" else BATTERY
        return [*words, "python3", battery, spec.name, config]


Launcher = Corral | Prefix


def launcher_for(text: str | None, profile: str | None, allow: Sequence[str] = ()
                 ) -> Launcher:
    """``--launcher``, ``--profile`` and ``--allow`` as a launcher: corral by default."""
    if text is None:
        from ..policy import Allow
        from ..profiles import load_profile

        policy = load_profile(profile or "generic")  # a bad name fails before anything is planted
        Allow().adding(allow)  # an unknown name fails here, before anything is planted
        return Corral(profile or "generic", allow=tuple(allow),
                      unix_sockets=policy.unix_sockets)
    if profile is not None or allow:
        raise UsageError("--profile and --allow apply to corral itself, not to --launcher",
                         "the launcher decides its own sandbox", "drop one of them")
    if text == "none":
        return Prefix("none")
    if text == "naive":
        return Prefix(f"naive: {NAIVE}", tuple(NAIVE.split()))
    try:
        words = tuple(shlex.split(text))
    except ValueError as e:
        raise UsageError(f"--launcher {text!r} cannot be split into words", str(e),
                         "quote it like a shell command line") from None
    if not words:
        raise UsageError("--launcher is empty", "", "give a command prefix, naive or none")
    if "/" in words[0] and not os.path.isabs(words[0]):  # launches start in other directories
        words = (os.path.abspath(words[0]), *words[1:])
    return Prefix(text, words)


@dataclass(slots=True)
class Outcome:
    """What one launch did: the battery's records, how the launcher ended, how long it took."""

    spec: LaunchSpec
    exit_code: int | None = None
    wall_s: float = 0.0
    killed: bool = False  # the probe's own deadline ended it, not the sandbox
    records: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    notes: str = ""  # from the trampoline: terminal, keyring
    session: int | None = None  # the launch's session and process group, for cleanup

    @property
    def started(self) -> bool:
        return any("launch" in r for r in self.records)

    @property
    def finished(self) -> bool:
        return any(r.get("done") for r in self.records)

    def result(self, ident: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r.get("id") == ident and "ok" in r), None)

    def began(self, ident: str) -> bool:
        return any(r.get("id") == ident for r in self.records)

    def progress(self, ident: str) -> int | None:
        values = [r["progress"] for r in self.records if r.get("id") == ident and "progress" in r]
        return values[-1] if values else None

    def ending(self) -> str:
        """How the launcher ended, in words, with its last error line."""
        if self.killed:
            return f"still running at the probe's deadline of {self.spec.deadline_s:g} s"
        last = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
        said = f": {last[0][:160]}" if last else ""
        return f"exit {self.exit_code}{said}"


def _records(data: bytes) -> list[dict[str, Any]]:
    found = []
    for line in data.split(b"\n"):
        if line.startswith(TAG):
            with contextlib.suppress(ValueError):
                record = json.loads(line[len(TAG):])
                if isinstance(record, dict):
                    found.append(record)
    return found


def execute(launcher: Launcher, spec: LaunchSpec, plant: Plant, env: dict[str, str],
            started: threading.Event | None = None) -> Outcome:
    """Run one launch to its end or to the probe's deadline; kill its session either way.

    ``started`` is set once the battery has begun inside (its first record), or the
    launch has ended without it."""
    config = json.dumps({"prefix": plant.prefix, "attempts": list(spec.attempts),
                         "exit": spec.exit}, separators=(",", ":"))
    argv = launcher.argv(spec, plant, config)
    status_r, status_w = os.pipe()
    env = dict(env, PWD=spec.cwd, CORRAL_PROBE_STATUS_FD=str(status_w))
    env.update((k, v.replace("$PATH", env.get("PATH", os.defpath))) for k, v in spec.env)
    if spec.kind == "main":
        env["CORRAL_PROBE_KEY"] = f"{plant.tag}-key\n{plant.tokens['keyring']}"
        env["CORRAL_PROBE_HOLD"] = plant.places()["inherited"]
    master, slave = os.openpty() if spec.terminal else (-1, -1)
    outcome = Outcome(spec)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", TRAMPOLINE, *argv], cwd=spec.cwd, env=env,
            stdin=slave if spec.terminal else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(status_w,))
    finally:
        os.close(status_w)
        if spec.terminal:
            os.close(slave)
    outcome.session = proc.pid
    try:
        out, err, notes = _collect(proc, status_r, start + spec.deadline_s, outcome, started)
    finally:
        if started is not None:
            started.set()
        # Only a launch that outlived the deadline is killed here: what a finished launch
        # left behind is for the lifecycle checks to find, and for the site to kill after.
        if outcome.killed or proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(status_r)
        if spec.terminal:
            os.close(master)
    code = proc.returncode
    outcome.exit_code = code if code >= 0 else 128 - code
    outcome.wall_s = time.monotonic() - start
    outcome.records = _records(out)
    outcome.stderr = err.decode(errors="replace")[-4000:]
    outcome.notes = notes.decode(errors="replace").strip()
    return outcome


def _collect(proc: subprocess.Popen[bytes], status_r: int, deadline: float, outcome: Outcome,
             started: threading.Event | None) -> tuple[bytes, bytes, bytes]:
    """Read the launcher's stdout, stderr and the trampoline's notes until it is done;
    ``started`` is set when the battery's first record comes."""
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(),
               status_r: bytearray()}
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                deadline = min(deadline, now + DRAIN_S)
            if not sel.get_map():  # every writer is gone, but the launcher may still be exiting
                try:
                    proc.wait(max(0.0, deadline - now))
                except subprocess.TimeoutExpired:
                    outcome.killed = True
                break
            if now >= deadline:
                outcome.killed = proc.poll() is None
                break
            for key, _ in sel.select(min(0.1, deadline - now)):
                chunk = os.read(int(key.fd), 65536)
                if not chunk:
                    sel.unregister(key.fd)
                elif len(streams[int(key.fd)]) < 1 << 22:
                    streams[int(key.fd)] += chunk
                    if started is not None and key.fd == proc.stdout.fileno() \
                            and TAG in streams[key.fd]:
                        started.set()
    return (bytes(streams[proc.stdout.fileno()]), bytes(streams[proc.stderr.fileno()]),
            bytes(streams[status_r]))


def launch_env(plant: Plant, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment: ``base`` (default: this process's), the fake home, and
    the canary variables."""
    env = dict(base if base is not None else os.environ)
    env.update(HOME=plant.home, SSH_AUTH_SOCK=plant.places()["agent_sock"])
    env.update(plant.env_tokens())
    return env
