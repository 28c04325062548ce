"""Front-end breaks found by the red team after issues 13 and 14 (requests, batch, serve, MCP,
the launcher under them), each reproduced for real, each with its control.

Run as root and as the test user.  Traffic goes only to servers these tests start on
127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import importlib.util
import json
import os
import resource
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, need, processes_with
from mcp_util import environ as mcp_environ
from mcp_util import eventually, sdk
from test_serve import Server, free_port, serve_extra

__all__ = ["sdk", "serve_extra"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.sandbox

# --- a request's environment never reaches corral's init ----------------------------------

# A shared object whose constructor leaves a mark in /work naming the process it ran in.  In
# an unprivileged process (gcc, or the payload) it also opens /work up, so that root's init
# of the next step could read the library too: the c language's compile step is that step.
PRELOAD = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char comm[32] = "", name[96];
    int f = open("/proc/self/comm", O_RDONLY);
    if (f >= 0) { read(f, comm, sizeof comm - 1); close(f); }
    comm[strcspn(comm, "\n")] = 0;
    if (getuid() != 0) { chmod("/work", 0777); chmod("/work/evil.so", 0644); }
    if (getuid() == 0) _exit(97);  /* only corral's init is uid 0 in a root-started run */
    snprintf(name, sizeof name, "/work/ran-%s-uid%d", comm, (int)getuid());
    close(open(name, O_WRONLY | O_CREAT, 0644));
}
"""

PRELOAD_RUNNER = """
import json, sys
from corral import bwrap
from corral.execute import run_request
from corral.request import RunRequest
if sys.argv[1] == "unprotected":  # the control: bwrap sets the payload's variables on the init
    bwrap.init_environment = lambda sb: sb.env
res = run_request(RunRequest.from_json(json.load(sys.stdin)), keep=True)
print(json.dumps(res.to_json()))
"""


def _preload_library(who: Identity) -> bytes:
    src, lib = who.tmp / "mark.c", who.tmp / "mark.so"
    src.write_text(PRELOAD)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib.read_bytes()


def _marks(who: Identity, request: dict[str, Any], mode: str,
           status: str = "exited") -> dict[str, int]:
    proc = subprocess.run([*who.prefix(), "-c", PRELOAD_RUNNER, mode], input=json.dumps(request),
                          env=who.environ(), cwd=who.tmp, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["status"] == status, res
    ws = Path(res["run"]["workspace"])
    return {p.name: p.stat().st_uid for p in ws.glob("ran-*")}


def test_a_requests_environment_never_reaches_corrals_init(who: Identity, each_init: str
                                                           ) -> None:
    """``env: {"LD_PRELOAD": ...}`` with the library among the request's ``files`` ran code in
    corral's init (as root: uid 0 with CAP_SETUID, before the drop; as a user: before
    Landlock, the payload's filter and the rlimits).  The init now starts with an empty
    environment and gives the request's variables to the payload only."""
    lib = _preload_library(who)
    request = {"code": "int main(void) { return 0; }", "language": "c",
               "files": {"evil.so": {"base64": base64.b64encode(lib).decode()}},
               "env": {"LD_PRELOAD": "/work/evil.so"}}
    marks = _marks(who, request, "protected")
    assert f"ran-main-uid{who.owner[0]}" in marks, marks  # the payload still gets the variable
    assert not [m for m in marks if m.startswith(("ran-python", "ran-init"))], marks
    if each_init == "c":
        # The compiled init is static: no dynamic loader, so LD_PRELOAD cannot reach it
        # even with the variables set on it (the control shows the loader's break only
        # for inner.py's interpreter, below).
        marks = _marks(who, request, "unprotected")
        assert not [m for m in marks if m.startswith("ran-init")], marks
        return
    # The control: with the variables set by bwrap, as before, the init runs the library.
    # Started by root, it no longer does even then: the init's loader ignores LD_PRELOAD
    # (seen here since the limits work; the cause is not pinned down), so the run exits
    # normally where a library run as uid 0 would have ended the init (status error).
    # Root's protection is the empty environment all the same; its control is not shown.
    if who.is_root:
        marks = _marks(who, request, "unprotected")
        assert not [m for m in marks if m.startswith("ran-python")], marks
    else:
        marks = _marks(who, request, "unprotected")
        assert [m for m in marks if m.startswith("ran-python")], marks


# --- corral serve: web pages of other sites ------------------------------------------------

def _post_as_browser(server: Server, path: str, body: bytes, headers: dict[str, str]
                     ) -> int:
    """A POST with the headers a browser would send: a rebound name in Host, a page's Origin,
    a text/plain body (a "simple" request: no CORS preflight)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        for name, value in {"Content-Type": "text/plain", **headers,
                            "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_web_pages_of_other_sites_cannot_use_a_loopback_server(who: Identity,
                                                                serve_extra: Path) -> None:
    """A server on 127.0.0.1 without a token answered any web page the user visited: a name
    rebound to 127.0.0.1 (Host: attacker.test) and a cross-site post (Origin:
    http://attacker.test) ran code and, rebound, read the answer."""
    job = json.dumps({"command": ["/bin/echo", "pwned"]}).encode()
    s = Server(who, serve_extra)
    try:
        rebound = {"Host": f"attacker.test:{s.port}"}
        cross_site = {"Host": f"127.0.0.1:{s.port}", "Origin": "http://attacker.test"}
        assert _post_as_browser(s, "/v1/runs", job, rebound) == 421
        assert _post_as_browser(s, "/v1/runs", job, cross_site) == 403
        assert _post_as_browser(s, "/run_code", job, {**cross_site, "Origin": "null"}) == 403
        assert s.get("/metrics")[1]["runs"] == 0, "nothing ran"
        # What programs send (veRL's client: no Origin) and a page of the server's own.
        assert _post_as_browser(s, "/v1/runs", job, {"Host": f"localhost:{s.port}"}) == 200
        assert _post_as_browser(s, "/v1/runs", job, {
            "Host": f"[::1]:{s.port}", "Origin": f"http://127.0.0.1:{s.port}"}) == 200
    finally:
        s.stop()
    # The control: the names allowed, the same posts run.
    s = Server(who, serve_extra, "--allow-host", "attacker.test")
    try:
        assert _post_as_browser(s, "/v1/runs", job, {"Host": f"attacker.test:{s.port}"}) == 200
        assert _post_as_browser(s, "/v1/runs", job, {
            "Host": f"127.0.0.1:{s.port}", "Origin": "http://attacker.test"}) == 200
        assert s.get("/metrics")[1]["runs"] == 2
    finally:
        s.stop()


# --- bad input is one line, never a traceback -----------------------------------------------

# Each hostile body and its honest twin: JSON's non-finite numbers (Python's parser takes NaN
# and Infinity; 1e999 is infinite) and lone surrogates ("\ud800" is valid JSON, no valid
# text) were a 500 with a traceback in the server's log, or a run failed as "a bug in corral".
HOSTILE_BODIES = [
    ("/v1/runs", '{"command": ["/bin/true"], "limits": {"cpus": Infinity}}', "1"),
    ("/v1/runs", '{"command": ["/bin/true"], "limits": {"cpus": 1e999}}', "1"),
    ("/v1/runs", '{"command": ["/bin/true"], "limits": {"timeout": NaN}}', "5"),
    ("/v1/runs", '{"command": ["/bin/echo", "\\ud800"]}', "\\u00e9"),
    ("/v1/runs", '{"command": ["/bin/true"], "files": {"\\ud800": "x"}}', "\\u00e9"),
    ("/v1/runs", '{"command": ["/bin/true"], "env": {"K": "\\udfff"}}', "\\u00e9"),
    ("/run_code", '{"code": "print(1)", "language": "python", "run_timeout": Infinity}', "5"),
    ("/run_code", '{"code": "\\ud800", "language": "python"}', "\\u00e9"),
]


def test_hostile_json_is_a_400_with_one_line_and_no_traceback(who: Identity,
                                                               serve_extra: Path) -> None:
    s = Server(who, serve_extra)
    try:
        for path, body, _ in HOSTILE_BODIES:
            status, reply, _ = s.post(path, None, raw=body.encode())
            assert status == 400 and "\n" not in reply["error"], (body, reply)
        status, reply, _ = s.post("/v1/runs", None, raw=b"[" * 100_000)
        assert status == 400, reply
        # stdin is bytes: a lone surrogate in its string form is a byte sequence, as in
        # /v1/runs (it was a 500 on /run_code).
        status, reply, _ = s.post("/run_code", None, raw=b'{"code": "import sys; print('
                                  b'len(sys.stdin.buffer.read()))", "language": "python", '
                                  b'"stdin": "\\ud800"}')
        assert status == 200 and reply["run_result"]["stdout"] == "3\n", reply
        # The control: each body with its hostile value replaced runs.
        for path, body, honest in HOSTILE_BODIES:
            for bad in ("Infinity", "1e999", "NaN", "\\ud800", "\\udfff"):
                body = body.replace(bad, honest)
            status, reply, _ = s.post(path, None, raw=body.encode())
            assert status == 200, (body, reply)
    finally:
        s.stop()
    log = (who.tmp / f"serve-{s.port}.log").read_text()
    assert "Traceback" not in log, log


# --- corral batch: every job one result -----------------------------------------------------

BATCH_RUNNER = """
import json, sys
from corral import batch
from corral.engines.local import LocalPool
if sys.argv[1] == "unprotected":  # the control: any line may take any line-N id
    batch.foreign_line_id = lambda given, number: False
jobs, out, runs = sys.argv[2:]
batch.run_batch(jobs, out, LocalPool(2, runs_dir=runs, keep=True), quiet=True)
"""


def _batch(who: Identity, jobs: list[dict[str, Any]], mode: str) -> dict[str, dict[str, Any]]:
    name = f"jobs-{mode}"
    path = who.tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    path.chmod(0o644)
    out, runs = who.tmp / f"{name}-out.jsonl", who.tmp / f"{name}-runs"
    proc = subprocess.run([*who.prefix(), "-c", BATCH_RUNNER, mode, str(path), str(out),
                           str(runs)], env=who.environ(), cwd=who.tmp, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len({r["id"] for r in lines}) == len(lines), lines
    return {r["id"]: r for r in lines}


def test_a_job_named_like_another_lines_default_id_loses_no_result(who: Identity) -> None:
    """Line 1 named itself "line-3", the id corral gives line 3 when it has none: line 3 was
    then "invalid, repeats the id" under that same id, and line 1's own result, written
    after, was dropped as a second result for it (and --resume would never run either)."""
    slow = {"id": "line-3", "command": ["/bin/sh", "-c", "sleep 2; echo one"]}
    jobs = [slow, {"command": ["/bin/echo", "two"]}, {"command": ["/bin/echo", "three"]}]
    got = _batch(who, jobs, "protected")
    assert set(got) == {"line-1", "line-2", "line-3"}, got
    assert got["line-1"]["status"] == "invalid" and "line-3" in got["line-1"]["error"]
    assert got["line-3"]["run"]["stdout"] == "three\n"
    # An id naming its own line is fine.
    assert _batch(who, [{**slow, "id": "line-1"}], "own")["line-1"]["status"] == "exited"
    # The control: without the rule, line 1 ran and its result is gone; line 3 never ran.
    got = _batch(who, jobs, "unprotected")
    assert got["line-3"]["status"] == "invalid" and len(got) == 2, got
    assert not [r for r in got.values() if r["run"] and r["run"]["stdout"] == "one\n"]


# --- slow and idle HTTP clients -------------------------------------------------------------

# uvicorn with corral.httpguard's protocol and tight bounds, serving an app that answers a
# small body for any request and 8 MiB for /big; the control serves plain uvicorn h11.
GUARD_RUNNER = """
import asyncio, sys, uvicorn
from corral import httpguard
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b"x" * (8 << 20) if scope["path"] == "/big" else b"ok"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
http = httpguard.protocol(head_s=1, body_s=2, send_s=2, max_waiting=8) \\
    if sys.argv[1] == "guarded" else "h11"
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), http=http, log_level="error",
            lifespan="off")
"""


def _guard_server(who: Identity, serve_extra: Path, mode: str) -> tuple[subprocess.Popen[str],
                                                                        int]:
    port = free_port()
    path = f"{who.src}:{serve_extra}" if who.src else str(serve_extra)
    proc = subprocess.Popen([*who.prefix(), "-c", GUARD_RUNNER, mode, str(port)],
                            env=who.environ({"PYTHONPATH": path}), cwd=who.tmp, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not _answered(port):
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    return proc, port


def _answered(port: int, path: str = "/") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            return s.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _connections(pid: int) -> int:
    """Sockets the server process holds (its connections, and a few of its own)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:  # closed since the listing (the server dropping a slow client): not counted
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


def _slow_clients(port: int) -> dict[str, socket.socket]:
    def half(data: bytes) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(data)
        return s

    clients = {
        "half head": half(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
        "half body": half(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n12345"),
        "non-reader": half(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
    }
    clients["non-reader"].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return clients


def test_slow_and_idle_clients_are_bounded(who: Identity, serve_extra: Path) -> None:
    """A half-sent head, a half-sent body and an unread 8 MiB answer each held their
    connection (and the answer's memory) for ever; idle connections only ever accumulated."""
    _slow_and_idle(who, serve_extra, "guarded")
    _slow_and_idle(who, serve_extra, "plain")  # the control: plain uvicorn keeps them all


def _slow_and_idle(who: Identity, serve_extra: Path, mode: str) -> None:
    proc, port = _guard_server(who, serve_extra, mode)
    clients: list[socket.socket] = []
    try:
        time.sleep(1)  # the server has let go of the connection that saw it start
        own = _connections(proc.pid)
        clients += _slow_clients(port).values()
        clients += [socket.create_connection(("127.0.0.1", port), timeout=10)
                    for _ in range(20)]
        if mode == "plain":
            time.sleep(5)
            assert _connections(proc.pid) == own + len(clients)
            return
        # Each bound is 1 or 2 s, and 8 may wait at once.
        assert eventually(lambda: _connections(proc.pid) <= own + 8, 30)
        assert _answered(port), "a client that sends its request at once is answered"
        for s in clients[3:]:
            s.close()
        assert eventually(lambda: _connections(proc.pid) <= own, 30), "the slow ones went"
    finally:
        for s in clients:
            s.close()
        proc.kill()
        proc.wait()


# The real servers, each with its clients' worst: half-sent heads by the hundred.  The control
# runs the same server on plain uvicorn (serve: with its old limit_concurrency).
FRONT_RUNNER = """
import sys
import corral.httpguard, corral.serve
from corral.cli import main
if sys.argv[1] == "plain":
    corral.httpguard.protocol = lambda *args, **kwargs: "h11"
    options = corral.serve.uvicorn_options
    def old(config):
        backlog = config.workers + config.queue
        return {**options(config), "limit_concurrency": 2 * backlog + 16}
    corral.serve.uvicorn_options = old
main(sys.argv[2:])
"""


def _front(who: Identity, pythonpath: str, mode: str, *args: str) -> subprocess.Popen[bytes]:
    # The server gets 512 descriptors, as a service often does (1,024 is Debian's default).
    return subprocess.Popen(["prlimit", "--nofile=512:512", *who.prefix(), "-c", FRONT_RUNNER,
                             mode, *args], env=who.environ({"PYTHONPATH": pythonpath}),
                            cwd=who.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _half_heads(port: int, count: int, path: str) -> list[socket.socket]:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, max(8192, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1])))
    out = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        out.append(s)
    return out


def _status(url: str, body: bytes | None = None, headers: dict[str, str] | None = None
            ) -> int | str:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.close()
        return e.code
    except OSError as e:
        return type(e).__name__


def test_half_sent_heads_cannot_wedge_corral_serve(who: Identity, serve_extra: Path) -> None:
    """540 half-sent heads made every later request a 503, /healthz included, for as long as
    the client kept them (with a token too: they never reach the token check)."""
    path = f"{who.src}:{serve_extra}" if who.src else str(serve_extra)
    job = json.dumps({"code": "print(6 * 7)", "language": "python"}).encode()
    for mode in ("guarded", "plain"):  # the control: uvicorn as corral used it
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with _wedged(who, path, mode, port, 540, "/run_code", url + "/healthz", None, {},
                     "serve", "--port", str(port), "--runs-dir", str(who.tmp / f"r-{mode}")):
            answers = [_status(url + "/healthz"), _status(url + "/run_code", job)]
            assert (answers == [200, 200]) == (mode == "guarded"), (mode, answers)


MCP_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "t", "version": "1"}}}).encode()
MCP_HEADERS = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}


def test_half_sent_heads_cannot_wedge_corral_mcp(who: Identity, sdk: Path | None) -> None:
    """600 half-sent heads used up an HTTP MCP server's 512 descriptors: no client could
    connect, and the server logged a traceback per refused connection."""
    path = mcp_environ(who, sdk).get("PYTHONPATH", "")
    for mode in ("guarded", "plain"):
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        with _wedged(who, path, mode, port, 600, "/mcp", url, MCP_INIT, MCP_HEADERS, "mcp",
                     "--transport", "http", "--port", str(port), "--runs-dir",
                     str(who.tmp / f"m-{mode}")):
            works = _status(url, MCP_INIT, MCP_HEADERS) == 200
            assert works == (mode == "guarded"), mode


@contextlib.contextmanager
def _wedged(who: Identity, pythonpath: str, mode: str, port: int, count: int, path: str,
            probe: str, body: bytes | None, headers: dict[str, str], *args: str
            ) -> Iterator[None]:
    """A front end started as ``who`` (``mode``: guarded or plain), answering ``probe``,
    then ``count`` connections that each sent half a head to ``path``."""
    proc = _front(who, pythonpath, mode, *args)
    idle: list[socket.socket] = []
    try:
        assert eventually(lambda: _status(probe, body, headers) == 200, 60)
        idle = _half_heads(port, count, path)
        time.sleep(1)
        yield
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait()


# --- corral serve: the bytes it holds -------------------------------------------------------

def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def _flood(s: Server, bodies: int) -> tuple[int, list[int]]:
    """The server's peak memory growth while one run holds its only worker and ``bodies``
    requests of 7 MiB each arrive at once; and their answers' statuses."""
    base = _peak_rss(s.proc.pid)
    blocker = threading.Thread(target=s.post, args=(
        "/v1/runs", {"command": ["/bin/sleep", "8"], "limits": {"timeout": 20}}))
    blocker.start()
    time.sleep(1)
    big = {"command": ["/bin/true"], "files": {"f": "x" * (7 << 20)}}
    with ThreadPoolExecutor(bodies) as pool:
        statuses = [status for status, _, _ in pool.map(lambda _: s.post("/v1/runs", big),
                                                         range(bodies))]
    blocker.join()
    return _peak_rss(s.proc.pid) - base, statuses


def test_request_bodies_held_are_bounded(who: Identity, serve_extra: Path) -> None:
    """Bodies were read and kept before admission and while waiting: 16 of 30 MiB took the
    server to 1.4 GiB, and 536 connections could hold that many (SIGKILL by the kernel, or
    the machine's memory).  What is held now is --max-pending, answered 429 beyond it."""
    args = ("--workers", "1", "--max-body", "8M")
    s = Server(who, serve_extra, *args, "--max-pending", "24M")
    try:
        s.post("/v1/runs", {"command": ["/bin/true"], "files": {"f": "x" * (7 << 20)}})
        growth, statuses = _flood(s, 24)
        assert 429 in statuses and 200 in statuses, statuses
        assert growth < 80 << 20, growth
        metrics = s.get("/metrics")[1]
        assert metrics["pending_bytes"] == 0 and metrics["rejected"] == statuses.count(429)
        assert s.post("/v1/runs", {"command": ["/bin/true"]})[0] == 200
    finally:
        s.stop()
    # The control: with room for all of them, the same flood is all taken, and held.
    s = Server(who, serve_extra, *args, "--max-pending", "1G")
    try:
        s.post("/v1/runs", {"command": ["/bin/true"], "files": {"f": "x" * (7 << 20)}})
        growth, statuses = _flood(s, 24)
        assert statuses == [200] * 24 and growth > 150 << 20, (growth, statuses)
    finally:
        s.stop()


# --- leftovers: a launcher stopped or killed ------------------------------------------------

LAUNCHER_RUNNER = """
import os, signal, sys
import corral.cgroups
from corral import cli
if sys.argv[1] == "no-sweep":  # the control of the sweep
    corral.cgroups.sweep_stale = lambda base, now=None: []
if sys.argv[1] == "signals-kill":  # the control of the unwinding: the signals' default
    def die(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    cli._stop = die
cli.main(sys.argv[2:])
"""
CONTROLLERS = ("pids", "memory", "cpuacct")


def _launcher(who: Identity, mode: str, runs: Path, *cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*who.prefix(), "-c", LAUNCHER_RUNNER, mode, "run", "--runs-dir",
                             str(runs), "--memory", "256M", "--", *cmd], env=who.environ(),
                            cwd=who.tmp, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _cgroups_of(who: Identity, run_id: str) -> list[Path]:
    return [p for c in CONTROLLERS
            if (p := Path(f"/sys/fs/cgroup/{c}/corral/uid-{who.uid}/{run_id}")).exists()]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_launcher_leaves_no_cgroup(who: Identity, signum: int) -> None:
    """SIGTERM (a service manager, a test harness's timeout) or SIGHUP (a closed terminal)
    ended `corral run` at once: the sandbox died with it (--die-with-parent), its cgroups
    stayed, one directory per controller; its record said "running".  The CLI now unwinds
    on them (main did it too, for the audit): no cgroup is left."""
    left, record = _stopped(who, signum, "protected")
    assert left == [] and record["status"] == "interrupted", (left, record)
    left, record = _stopped(who, signum, "signals-kill")  # the control: they were left
    assert len(left) == len(CONTROLLERS) and record["status"] == "running"


def _stopped(who: Identity, signum: int, mode: str) -> tuple[list[Path], dict[str, Any]]:
    """The cgroups left by a `corral run` stopped with ``signum``, and its record."""
    marker = f"corral-stop-{os.urandom(4).hex()}"
    runs = who.tmp / f"runs-{mode}-{int(signum)}"
    proc = _launcher(who, mode, runs, "/bin/sh", "-c", f"sleep 60; : {marker}")
    run_id = ""
    try:
        assert eventually(lambda: runs.exists() and len(os.listdir(runs)) == 1, 60)
        (run_id,) = os.listdir(runs)
        assert eventually(lambda: len(_cgroups_of(who, run_id)) == len(CONTROLLERS)
                          and len(processes_with(marker)) > 1, 60)  # the payload runs
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == (128 + signum if mode == "protected" else -signum)
        assert eventually(lambda: processes_with(marker) == [], 60), (mode, signum)
        return _cgroups_of(who, run_id), json.loads((runs / run_id / "record.json").read_text())
    finally:
        proc.kill()
        proc.wait()
        for p in _cgroups_of(who, run_id):  # the control's, once its processes are gone
            assert eventually(lambda p=p: _rmdir(p), 30)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True


@pytest.mark.alone  # any root run sweeps root's folder: another session's would take `old`
def test_cgroups_of_killed_launchers_are_swept(who: Identity) -> None:
    """A launcher SIGKILLed (a Ray node removed) cannot clean up: 86 empty run cgroups were
    found piled up after many test sessions.  The next run removes those that are empty and
    older than ten minutes; a young one (a run starting now) and a busy one stay."""
    old, young = "20200101T000000-0badc0de", time.strftime(
        "%Y%m%dT%H%M%S-5eedc0de", time.gmtime())
    for mode in ("protected", "no-sweep"):
        made = [Path(f"/sys/fs/cgroup/{c}/corral/uid-{who.uid}/{name}")
                for c in CONTROLLERS for name in (old, young)]
        try:
            for p in made:
                p.mkdir()
            proc = _launcher(who, mode, who.tmp / f"sweep-{mode}", "/bin/true")
            assert proc.wait(timeout=120) == 0
            if mode == "protected":
                assert _cgroups_of(who, old) == [] and len(_cgroups_of(who, young)) == 3
            else:  # the control: without the sweep the leftover stays
                assert len(_cgroups_of(who, old)) == 3
        finally:
            for p in made:
                with contextlib.suppress(FileNotFoundError):
                    p.rmdir()


DYING_RUNNER = """
import os, signal, subprocess, sys
import corral, corral.launch
mode, marker = sys.argv[1], sys.argv[2]
real_popen, real_argv = subprocess.Popen, corral.launch.Launch.argv
# "late": bwrap (or its joiner) execs only once this launcher is dead and reaped, so the
# window the controls need (bwrap's status write after the launcher is gone) is certain,
# not a race the scheduler may lose under load; "protected" keeps the random moment.
WAIT_FOR_LAUNCHER = 'while kill -0 "$0" 2>/dev/null; do sleep 0.05; done; exec "$@"'
class Dying(real_popen):
    def __init__(self, args, *rest, **kw):
        bwrap = "--args" in args  # bwrap (or its joiner) is started: die while it sets up
        if bwrap and mode != "protected":
            args = ["/bin/sh", "-c", WAIT_FOR_LAUNCHER, str(os.getpid()), *args]
        super().__init__(args, *rest, **kw)
        if bwrap:
            os.kill(os.getpid(), signal.SIGKILL)
subprocess.Popen = Dying
real_spawn = os.posix_spawn
def dying_spawn(path, args, *rest, **kw):  # the compiled init's start (launch.spawn)
    bwrap = "--args" in args
    if bwrap and mode != "protected":
        path, args = "/bin/sh", ["/bin/sh", "-c", WAIT_FOR_LAUNCHER, str(os.getpid()), *args]
    pid = real_spawn(path, args, *rest, **kw)
    if bwrap:
        os.kill(os.getpid(), signal.SIGKILL)
    return pid
os.posix_spawn = dying_spawn
if mode == "unread":  # control: bwrap keeps no reader of its --json-status-fd pipe
    def argv(self, *a):
        words, keep = real_argv(self, *a)
        return words, [fd for fd in keep if fd != self.json_r]
    corral.launch.Launch.argv = argv
if mode == "unwatched":  # control: the init watches PID 1, which never goes, not us,
    def argv(self, s, j, e, l):  # and its reports find a reader (bwrap holds one too)
        words, keep = real_argv(self, s, j, e, os.pidfd_open(1))
        return words, [*keep, self.status_r]
    corral.launch.Launch.argv = argv
corral.run(["/bin/sh", "-c", f"sleep 60; : {marker}"])
"""


@pytest.mark.parametrize("init", ["c", "python"])
def test_a_launcher_killed_while_bwrap_sets_up_leaves_nothing(who: Identity, init: str
                                                               ) -> None:
    """A launcher SIGKILLed in the milliseconds bwrap takes to set up (150 kills at random
    moments of `corral.run`) left 13 processes for ever: bwrap's sandbox child, blocked on
    bwrap's eventfd (its parent died of EPIPE on --json-status-fd, or of --die-with-parent
    armed just before it let the child go on), in no cgroup the sweep removes.  Now bwrap
    keeps a reader of that pipe, corral drops --die-with-parent, and the init watches a
    pidfd of the launcher: the sandbox ends.  Controls: each half removed leaves processes
    (the blocked child; or the payload running on, unsupervised)."""
    if init == "c":
        from corral import cinit
        need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    for mode in ("protected", "protected-late", "unread", "unwatched"):
        marker = f"corral-dying-{os.urandom(4).hex()}"
        runs = _killed_launcher(who, DYING_RUNNER, mode, marker, init)
        if mode.startswith("protected"):
            assert eventually(lambda m=marker: processes_with(m) == [], 60), mode
        else:
            time.sleep(3)  # nothing ends them: still there after a while
            left = processes_with(marker)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            assert eventually(lambda m=marker: processes_with(m) == [], 60)
            assert left, f"the control {mode} left nothing"
        _remove_cgroups(who, runs)


def _killed_launcher(who: Identity, runner: str, mode: str, marker: str, init: str,
                     *more: str) -> Path:
    """Run ``runner`` (which SIGKILLs itself during its run); its runs directory."""
    runs = who.tmp / f"runs-{marker}"
    proc = subprocess.Popen([*who.prefix(), "-c", runner, mode, marker, *more],
                            env=who.environ({"CORRAL_INIT": init, "CORRAL_RUNS_DIR": str(runs)}),
                            cwd=who.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(timeout=120) == -signal.SIGKILL
    return runs


def _remove_cgroups(who: Identity, runs: Path) -> None:
    """The cgroups the runs in ``runs`` left (their launchers killed), once empty: a --cpus
    run's cpu cgroup too, its payload child first."""
    for run_id in os.listdir(runs) if runs.exists() else []:
        cpu = Path(f"/sys/fs/cgroup/cpu/corral/uid-{who.uid}/{run_id}")
        for p in [*_cgroups_of(who, run_id), *([cpu / "payload", cpu] if cpu.exists() else [])]:
            assert eventually(lambda p=p: _rmdir(p) or not p.exists(), 30)


STARVING_RUNNER = """
import os, signal, sys, threading
from corral import limits
from corral.cli import main
mode, marker, spin = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "capped":  # the control: corral's init shares the payload's CPU cap, as before
    limits.Plan.payload_dirs = lambda self, run_id: []
    limits.Plan.setting_path = lambda self, run_id, c, name: os.path.join(self.dirs(run_id)[c],
                                                                          name)
# 10 s: under the cap, the Python init's own start and the 1000 threads' creation took
# most of 5 s, and the control's payload was not yet spinning when its launcher went.
threading.Timer(10, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
main(["run", "--cpus", "0.02", "--pids", "1100", "--timeout", "300", "--input", spin, "--",
      "/work/spin", "1000", marker])
"""
# N threads that spin, made parked on a barrier (cheap even under the cap), then let go.
SPIN = r"""
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static pthread_barrier_t go;
static void *spin(void *a) {
    (void)a;
    pthread_barrier_wait(&go);
    for (volatile unsigned long i = 0;; i++) {}
    return 0;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 65536);
    pthread_barrier_init(&go, 0, n + 1);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &at, spin, 0)) return 1;
    }
    pthread_barrier_wait(&go);
    for (;;) pause();
}
"""


@pytest.mark.parametrize("init", ["c", "python"])
def test_a_payload_cannot_starve_its_init_of_cpu_under_its_cap(who: Identity, init: str
                                                               ) -> None:
    """corral's init sat in the run's CPU cap (--cpus) with the payload: 1000 spinning
    threads under --cpus 0.02 kept it from running for minutes, so it never saw its
    launcher go, and the sandbox outlived a SIGKILLed corral (20 minutes once) and its
    timeout; in agent mode it planted files for host git meanwhile (found by review).
    Now only the payload is in the cap (the init moves it into a child cgroup before it
    starts it).  Control: the cap on the init too, the payload outlives its launcher."""
    if init == "c":
        from corral import cinit
        need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    spin = _compiled(who, "spin", SPIN, "-pthread")
    _outlives_its_launcher(who, STARVING_RUNNER, ("uncapped", "capped"), init, spin)


def _compiled(who: Identity, name: str, source: str, *flags: str) -> str:
    program = who.tmp / name
    Path(f"{program}.c").write_text(source)
    subprocess.run(["gcc", "-O2", *flags, "-o", str(program), f"{program}.c"], check=True)
    program.chmod(0o755)
    return str(program)


def _outlives_its_launcher(who: Identity, runner: str, modes: tuple[str, str], init: str,
                           *more: str) -> None:
    """``runner`` SIGKILLs itself during its run: in the first mode (protected) the
    sandbox ends with it; in the second (the control) it is still there 5 s later, in one
    of three tries (the attacks are races: a flood that a loaded machine slows lost one
    once in CI, at a load average of 16)."""
    for mode in modes:
        for _ in range(1 if mode == modes[0] else 3):
            marker = f"corral-outliving-{os.urandom(4).hex()}"
            runs = _killed_launcher(who, runner, mode, marker, init, *more)
            if mode == modes[0]:
                assert eventually(lambda m=marker: processes_with(m) == [], 60), mode
                left = []
            else:
                time.sleep(5)
                left = processes_with(marker)
                _uncap_and_kill(left)
                assert eventually(lambda m=marker: processes_with(m) == [], 60)
            _remove_cgroups(who, runs)
            if left:
                break
        else:
            assert mode == modes[0], f"the control {mode}'s payload died with its launcher"


def _uncap_and_kill(pids: list[int]) -> None:
    """SIGKILL lands on a process only once it runs: lift the cap of its cgroup first."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                if line.split(":")[1] == "cpu":
                    Path(f"/sys/fs/cgroup/cpu{line.split(':')[2]}/cpu.cfs_quota_us"
                         ).write_text("-1")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


STOPPING_RUNNER = """
import os, signal, sys, threading
import corral, corral.launch, corral.record
mode, marker = sys.argv[1], sys.argv[2]
real_init = corral.launch.Launch.__init__
def init(self, sb, **kw):  # as on a host below Landlock ABI 6: no signal scope
    config = dict(sb.init_config, landlock=dict(sb.init_config["landlock"], scope=False))
    # the control: what the sandbox gets where the init cannot be signalled
    shielded = mode == "shielded" if hasattr(sb, "init_shielded") else True
    sb = corral.record.replace(sb, init_config=config,
                               **({"init_shielded": shielded} if hasattr(sb, "init_shielded")
                                  else {}))
    real_init(self, sb, **kw)
corral.launch.Launch.__init__ = init
threading.Timer(6, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
corral.run(["/bin/sh", "-c", f"kill -STOP 2; sleep 60; : {marker}"])
"""


@pytest.mark.parametrize("init", ["c", "python"])
def test_a_payload_that_stops_its_init_dies_with_its_launcher(who: Identity, init: str
                                                              ) -> None:
    """Below Landlock ABI 6 (Linux < 6.12) nothing stops a payload from signalling its
    init: it SIGSTOPs it, and once the launcher is SIGKILLed nobody watches any more;
    without bwrap's --die-with-parent the payload ran on, with no timeout.  There the
    sandbox keeps --die-with-parent.  Control: the init taken for shielded (no flag), the
    payload outlives its launcher, its init stopped."""
    if init == "c":
        from corral import cinit
        need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    for mode in ("exposed", "shielded"):
        marker = f"corral-stopping-{os.urandom(4).hex()}"
        runs = _killed_launcher(who, STOPPING_RUNNER, mode, marker, init)
        if mode == "exposed":
            assert eventually(lambda m=marker: processes_with(m) == [], 60), mode
        else:
            time.sleep(3)
            left = processes_with(marker)
            stopped = [pid for pid in left if _state(pid) == "T"]
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            assert eventually(lambda m=marker: processes_with(m) == [], 60)
            assert left and stopped, f"the control left {left}, stopped {stopped}"
        _remove_cgroups(who, runs)


FLOODING_RUNNER = """
import os, signal, sys, threading
import corral.egress.session as session
from corral.cli import main
mode, marker, flood = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "unbounded":  # the control: the init passes on connections until none waits
    config = session.Bridge.config
    session.Bridge.config = lambda self: {**config(self), "batch": 2**31 - 1}
threading.Timer(8, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
main(["run", "--allow-domain", "x.test", "--timeout", "300", "--input", flood,
      "--", "/work/flood", "100", marker])
"""
# N processes connect to the bridge and close, in a loop: the accept queue is never empty.
FLOOD = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(3128)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    for (int i = atoi(argv[1]); i > 0; i--)
        if (fork() == 0)
            for (;;) {
                int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
                connect(s, (struct sockaddr *)&to, sizeof to);
                close(s);
            }
    sleep(300);
    return 0;
}
"""


@pytest.mark.parametrize("init", ["c", "python"])
def test_a_connect_flood_cannot_keep_the_init_from_seeing_its_launcher_go(
        who: Identity, init: str) -> None:
    """The init serves the egress bridge and watches the launcher in one loop, and it
    passed on connections until none was waiting before it looked at the launcher again:
    processes connecting and closing in a loop (40, or 100) kept it from ever looking, and a
    SIGKILLed corral's sandbox ran on past its timeout (in agent mode, planting files for
    host git once the audit was gone; found by review).  Now it passes on at most a batch
    per wake-up.  Control: the batch unbounded, the payload outlives its launcher.  (No
    --cpus: under a CPU cap the init, outside it, has half the CPU, and keeps up.)"""
    if init == "c":
        from corral import cinit
        need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    flood = _compiled(who, "flood", FLOOD)
    _outlives_its_launcher(who, FLOODING_RUNNER, ("bounded", "unbounded"), init, flood)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"

# --- the Ray engine's own cluster -----------------------------------------------------------

RAY_RUNNER = """
import json, os, stat, sys
from corral.engines.ray import RayEngine
from corral.request import RunRequest
if sys.argv[1] == "unprotected":  # the control: Ray's own default, a token file in ~/.ray
    RayEngine._own_token = lambda self: None
engine = RayEngine(runs_dir=sys.argv[2])
[res] = engine.map([RunRequest(command=("/bin/echo", "hi"), id="r")])
token = os.path.join(os.environ["HOME"], ".ray", "auth_token")
print(json.dumps({"stdout": res.run.stdout.decode() if res.run else res.error,
                  "token_mode": stat.S_IMODE(os.stat(token).st_mode)
                  if os.path.exists(token) else None,
                  "env_after": {k: os.environ.get(k) for k in ("RAY_AUTH_MODE",
                                                               "RAY_AUTH_TOKEN")}}))
"""


def test_the_ray_engines_own_cluster_token_is_in_no_file(root: Identity) -> None:
    """`corral batch --engine ray` without --address starts a Ray, and Ray (2.60) wrote its
    token to ~/.ray/auth_token, mode 0644: in a home other users may enter, any local user
    read it, and the cluster's GCS accepted it from them (shown by hand as nobody, against a
    batch run by a plain user).  The token now lives only in the Ray processes' environment.
    Root only, as every Ray test (test_ray.py says why)."""
    need(importlib.util.find_spec("ray") is not None, "Ray (corral[ray]) is installed")
    for mode in ("protected", "unprotected"):
        home = root.tmp / f"home-{mode}"
        home.mkdir(mode=0o755)
        env = {**root.environ(), "HOME": str(home)}
        env.pop("RAY_AUTH_MODE", None)
        proc = subprocess.run([*root.prefix(), "-c", RAY_RUNNER, mode, str(root.tmp / "runs")],
                              env=env, cwd=root.tmp, capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.splitlines()[-1])
        assert got["stdout"] == "hi\n", got
        if mode == "protected":
            assert got["token_mode"] is None, got
            assert got["env_after"] == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None}
        else:  # the control: readable by every user who can enter the home directory
            assert got["token_mode"] is not None and got["token_mode"] & 0o044, got


# --- DNS rebinding against any loopback address ---------------------------------------------

# The front end, its Host and Origin checks left out in the control ("unguarded").
REBIND_RUNNER = """
import sys
if sys.argv[1] == "unguarded" and sys.argv[2] == "mcp":
    import corral.mcp.server
    corral.mcp.server.rebinding_guard = lambda host: None
if sys.argv[1] == "unguarded" and sys.argv[2] == "serve":
    import corral.serve.app
    corral.serve.app.App._check_host = lambda self, scope: None
from corral.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("kind", ["serve", "mcp"])
def test_a_page_cannot_rebind_to_any_loopback_address(who: Identity, kind: str,
                                                      request: Any) -> None:
    """127.0.0.0/8 is loopback: either server bound to 127.0.0.2 needs no token.  corral mcp
    there had no Host check at all (the SDK guards 127.0.0.1, localhost and ::1 only), so a
    web page whose name was rebound to 127.0.0.2 ran code in it; now both servers refuse a
    foreign Host (421) and Origin (403) on every loopback address."""
    extra = request.getfixturevalue("serve_extra" if kind == "serve" else "sdk")
    path = mcp_environ(who, extra).get("PYTHONPATH", "") if kind == "mcp" else (
        f"{who.src}:{extra}" if who.src else str(extra))
    for mode in ("guarded", "unguarded"):
        port = free_port()
        url, body, headers = (f"http://127.0.0.2:{port}/mcp", MCP_INIT, MCP_HEADERS) \
            if kind == "mcp" else (f"http://127.0.0.2:{port}/metrics", None, {})
        args = (kind, "--host", "127.0.0.2", "--port", str(port), "--runs-dir",
                str(who.tmp / f"rebind-{kind}-{mode}")) + (("--transport", "http")
                                                           if kind == "mcp" else ())
        proc = subprocess.Popen([*who.prefix(), "-c", REBIND_RUNNER, mode, *args],
                                env=who.environ({"PYTHONPATH": path}), cwd=who.tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert eventually(lambda u=url, b=body, h=headers: _status(u, b, h) == 200, 60)
            rebound = _status(url, body, {**headers, "Host": f"rebound.example:{port}"})
            foreign = _status(url, body, {**headers, "Origin": "http://rebound.example"})
            assert (rebound, foreign) == ((421, 403) if mode == "guarded" else (200, 200))
        finally:
            proc.kill()
            proc.wait()
