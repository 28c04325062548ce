"""The egress proxy starts beside bwrap, not before it (issue 12's start-up half).

bwrap is launched while the proxy's thread still imports asyncio.  What must hold:
a connection the payload makes at once waits on the bridge's pair and is served; a
proxy that fails to start relays nothing and the run says so (status ``error``); and
close() never closes a descriptor the thread may still use.  The origin listens on
the host's 127.0.0.1, reached through a name pinned with ``resolve``.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import Identity
from corral import cinit
from corral.egress import session as egress_session
from corral.egress.session import Session, open_session
from corral.errors import LaunchError
from corral.policy import Network
from egress_util import Origin, write_script

START = r"""
import json, sys, time
import corral
from corral.egress import session as es
from corral.policy import Network, Policy
mode, port = sys.argv[1], sys.argv[2]
real, marks = es.Session._serve, {}
def late(self, ours, log):  # the proxy's thread, held back until the payload has connected
    time.sleep(2)
    marks["attach"] = time.time()
    if mode == "fail":
        raise OSError("forced for the test")
    return real(self, ours, log)
if mode != "normal":
    es.Session._serve = late
payload = '''
import sys, time, urllib.request as u
asked = time.time()  # the request goes out at once, at the payload's start
try:
    print(asked, u.urlopen("http://origin.test:%s/early" % sys.argv[1], timeout=60).status)
except Exception as e:
    print(asked, "failed", type(e).__name__)
'''
policy = Policy(network=Network(allow=("origin.test",), resolve=(("origin.test", "127.0.0.1"),)))
r = corral.run(["python3", "-c", payload, port], policy)
with open(r.record) as f:
    record = json.load(f)
print(json.dumps({"status": r.status, "exit": r.exit_code, "error": r.error,
                  "stdout": r.stdout.decode(), "attach": marks.get("attach"),
                  "record": [record.get("status"), record.get("error")]}))
"""


def _start(who: Identity, mode: str, port: int) -> dict[str, object]:
    script = write_script(who, "start.py", START)
    proc = subprocess.run([*who.prefix(), str(script), mode, str(port)], env=who.environ(),
                          cwd=who.tmp, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def test_a_connection_made_at_once_waits_for_the_proxy_and_is_served(who: Identity) -> None:
    with Origin() as origin:
        r = _start(who, "late", origin.port)
        when, status = str(r["stdout"]).split()
        assert (r["status"], r["exit"], status) == ("exited", 0, "200"), r
        # Asked before the proxy was attached (one clock: the host's), so it waited on
        # the pair; the control of the waiting is the failure test below.
        assert isinstance(r["attach"], float)
        if cinit.choice() == "c":  # else the launcher waits for the proxy (api._execute)
            assert float(when) < r["attach"], r
        assert origin.connections == 1


def test_a_proxy_that_fails_to_start_relays_nothing_and_the_run_says_so(who: Identity) -> None:
    with Origin() as origin:
        control = _start(who, "normal", origin.port)
        assert (control["status"], str(control["stdout"]).split()[1:]) == ("exited", ["200"])
        assert origin.connections == 1  # control: a normal start relays
        r = _start(who, "fail", origin.port)
        assert str(r["stdout"]).split()[1] == "failed", r
        assert origin.connections == 1  # nothing more reached the origin
        assert (r["status"], r["exit"]) == ("error", 125), r
        assert "egress proxy failed (OSError: forced for the test)" in str(r["error"])
        assert r["record"] == ["error", r["error"]]


def test_the_thread_owns_its_descriptors_until_it_ends(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while the thread still starts (and past its join timeout): the proxy's end of
    the pair and the log stay open for the thread, which closes them and never attaches;
    control: a session whose thread has ended is closed whole by close()."""
    gate, seen = threading.Event(), {}
    real = Session._serve

    def held(self: Session, ours: object, log: object) -> None:
        gate.wait(60)
        seen["fd"] = ours.fileno()  # type: ignore[attr-defined]
        real(self, ours, log)  # type: ignore[arg-type]

    monkeypatch.setattr(Session, "_serve", held)
    monkeypatch.setattr(egress_session, "STOP_TIMEOUT_S", 0.2)
    s = open_session(Network(allow=("x.test",)), str(tmp_path))
    assert isinstance(s, Session) and s.ours is not None and s.log is not None
    s.close()
    assert s.thread is not None and s.thread.is_alive()
    assert s.ours.fileno() >= 0 and s.log.fd >= 0  # left to the thread, not closed under it
    gate.set()
    s.thread.join(60)
    assert seen["fd"] >= 0 and s.ours.fileno() == -1 and s.log.fd == -1
    assert s.proxy is None and s.failure is None  # closing came first: never attached
    with pytest.raises(LaunchError):
        s.wait()

    monkeypatch.setattr(Session, "_serve", real)
    monkeypatch.setattr(egress_session, "STOP_TIMEOUT_S", 30.0)
    done = open_session(Network(allow=("x.test",)), str(tmp_path))
    assert isinstance(done, Session) and done.wait() is done.proxy
    done.close()
    assert done.thread is not None and not done.thread.is_alive()
    assert done.ours is not None and done.ours.fileno() == -1
    assert done.theirs is not None and done.theirs.fileno() == -1


def test_a_proxy_failed_before_the_launch_stops_it(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Session, ours: object, log: object) -> None:
        raise OSError("no loop")

    monkeypatch.setattr(Session, "_serve", broken)
    s = open_session(Network(allow=("x.test",)), str(tmp_path))
    assert isinstance(s, Session) and s.thread is not None
    s.thread.join(60)
    with pytest.raises(LaunchError, match="egress proxy failed"):
        s.attach(None)  # type: ignore[arg-type]
    s.close()
