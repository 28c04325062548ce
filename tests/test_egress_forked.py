"""The CLI's proxy runs in a forked child process (corral/egress/forked.py).

What must hold for it, as for the thread: a proxy process that dies relays nothing
more and the run ends in status ``error``, exit 125; it dies with corral, even when
corral is killed by SIGKILL; it keeps none of corral's descriptors but its own; and a
library caller's process never forks one.  The origin listens on the host's
127.0.0.1, reached through a name pinned with ``--resolve``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import corral.egress
from conftest import Identity
from corral.egress import session as egress_session
from egress_util import Handler, Origin, write_script

PAYLOAD = r"""
import sys, time, urllib.request as u
port = sys.argv[1]
def get(path):
    try:
        return str(u.urlopen(f"http://origin.test:{port}{path}", timeout=60).status)
    except Exception as e:
        return type(e).__name__
print(get("/first"), get("/hold"), get("/after"), flush=True)
if len(sys.argv) > 2:
    time.sleep(120)  # held until corral itself is killed
"""


class Holding(Handler):
    """``/hold`` answers only once the test lets it (``server.release``)."""

    server: Held

    def do_GET(self) -> None:
        if self.path == "/hold":
            self.server.holding.set()
            self.server.release.wait(120)
        super().do_GET()


class Held(Origin):
    def __init__(self) -> None:
        super().__init__(Holding)
        self.holding, self.release = threading.Event(), threading.Event()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _proxy_of(corral_pid: int) -> int:
    """The forked proxy: corral's child with corral's own command line (bwrap is the other)."""
    mine = _cmdline(corral_pid)
    proxies = [p for p in _children(corral_pid) if _cmdline(p) == mine]
    assert len(proxies) == 1, (proxies, _children(corral_pid))
    return proxies[0]


def _signals(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        rows = [line.split(":", 1) for line in f if line.startswith(("SigIgn", "SigCgt"))]
    return {k: int(v, 16) for k, v in rows}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def _corral(who: Identity, origin: Origin, *extra: str) -> Iterator[subprocess.Popen[str]]:
    script = write_script(who, "forked.py", PAYLOAD)
    proc = subprocess.Popen(
        [*who.prefix(), "-m", "corral", "run", "--json", "--input", str(script),
         "--allow-domain", "origin.test", "--resolve", "origin.test:127.0.0.1", "--",
         "python3", "forked.py", str(origin.port), *extra],
        env=who.environ(), cwd=who.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None and not proc.stdout.closed:
            proc.communicate(timeout=120)


def _held(origin: Held, proc: subprocess.Popen[str]) -> int:
    """Wait for the payload's /hold request; the proxy's pid."""
    assert origin.holding.wait(120), "the payload's /hold never arrived"
    return _proxy_of(proc.pid)


def test_a_proxy_process_that_dies_fails_the_run_closed(who: Identity) -> None:
    """Control: the same run with its proxy left alone relays all three requests."""
    with Held() as origin, _corral(who, origin) as proc:
        proxy = _held(origin, proc)
        assert proxy != proc.pid and _alive(proxy)
        origin.release.set()
        out, err = proc.communicate(timeout=120)
    r = json.loads(out)
    assert (r["status"], r["exit_code"], r["stdout"].split()) == ("exited", 0,
                                                                   ["200", "200", "200"]), err
    assert r["error"] is None and proc.returncode == 0
    assert not _alive(proxy)  # reaped: no zombie, no straggler

    with Held() as origin, _corral(who, origin) as proc:
        os.kill(_held(origin, proc), signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        origin.release.set()
        after = [path for _, path, _ in origin.requests]
    r = json.loads(out)
    first, held, later = r["stdout"].split()
    assert first == "200" and held != "200" and later != "200", r  # cut, then nothing
    assert "/after" not in after, r  # nothing relayed after its death
    assert (r["status"], r["exit_code"], proc.returncode) == ("error", 125, 125), r
    assert "egress proxy failed" in r["error"] and "signal 9" in r["error"], r
    record = json.loads(Path(r["record"]).read_text())
    assert (record["status"], record["error"]) == ("error", r["error"])


def test_the_proxy_process_dies_with_corral_even_by_sigkill(who: Identity) -> None:
    """Control: it lives while corral does (after its requests, the payload sleeps)."""
    with Held() as origin, _corral(who, origin, "sleep") as proc:
        proxy = _held(origin, proc)
        origin.release.set()
        deadline = time.monotonic() + 60
        while len(origin.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert _alive(proxy)  # control: the run goes on, so does its proxy
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _alive(proxy) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(proxy), "the proxy outlived corral"


def test_the_proxy_process_keeps_only_its_own_descriptors(who: Identity) -> None:
    """Its 0, 1 and 2 are /dev/null while corral's stdout is the test's pipe (the control);
    every other descriptor is a socket, a pipe to corral, /dev/null, its event loop's epoll
    or the decision log.  It ignores SIGINT, which corral catches (Ctrl-C reaches both)."""
    with Held() as origin, _corral(who, origin) as proc:
        proxy = _held(origin, proc)
        fds = {int(n): os.readlink(f"/proc/{proxy}/fd/{n}") for n in os.listdir(
            f"/proc/{proxy}/fd")}
        parent_out = os.readlink(f"/proc/{proc.pid}/fd/1")
        ignored, caught = _signals(proxy), _signals(proc.pid)
        origin.release.set()
        proc.communicate(timeout=120)
    assert parent_out.startswith("pipe:")  # control: what the child would have kept
    sigint = 1 << (signal.SIGINT - 1)
    assert ignored["SigIgn"] & sigint and caught["SigCgt"] & sigint  # Ctrl-C is corral's
    assert [fds[i] for i in (0, 1, 2)] == ["/dev/null"] * 3, fds
    odd = [t for t in fds.values() if not (t in ("/dev/null", "anon_inode:[eventpoll]")
                                           or t.startswith(("socket:", "pipe:"))
                                           or t.endswith("/egress.jsonl"))]
    assert odd == [], fds


def test_a_library_process_keeps_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only corral's CLI asks for the fork, and never with another thread alive."""
    assert not egress_session._forking()  # a library caller (this one): the thread
    monkeypatch.setattr(corral.egress, "FORK_PROXIES", True)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not egress_session._forking()  # another thread: its locks; no fork
    finally:
        stop.set()
        other.join()
    assert egress_session._forking()  # control: asked, and one thread


STUCK = r"""
import json, sys, time
import corral, corral.egress
from corral.egress import session as es
from corral.policy import Network, Policy
stuck = sys.argv[1] == "stuck"
real = es.Session._serve
def serve(self, ours, log):  # in the forked proxy: never stops when told to
    if stuck:
        time.sleep(3600)
    return real(self, ours, log)
es.Session._serve, es.STOP_TIMEOUT_S = serve, 2.0
corral.egress.fork_proxies()  # as the CLI does
policy = Policy(network=Network(allow=("origin.test",)))
start = time.monotonic()
r = corral.run(["/bin/true"], policy)
print(json.dumps({"status": r.status, "exit": r.exit_code, "error": r.error,
                  "took": time.monotonic() - start}))
"""


def test_a_proxy_process_that_will_not_stop_is_killed_and_fails_the_run(who: Identity
                                                                         ) -> None:
    """Control: the same run with a proxy that stops when told ends ``exited``."""
    script = write_script(who, "stuck.py", STUCK)
    out = {}
    for mode in ("stuck", "normal"):
        proc = subprocess.run([*who.prefix(), str(script), mode], env=who.environ(),
                              cwd=who.tmp, capture_output=True, text=True, timeout=300,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        out[mode] = json.loads(proc.stdout)
    assert (out["normal"]["status"], out["normal"]["exit"]) == ("exited", 0), out
    assert (out["stuck"]["status"], out["stuck"]["exit"]) == ("error", 125), out
    assert "did not stop in time" in out["stuck"]["error"], out
    assert out["stuck"]["took"] < 120, out  # killed after its 2 s, not left running
