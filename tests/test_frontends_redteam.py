"""Front-end breaks found by the red team after issues 13 and 14 (requests, batch, serve, MCP,
the launcher under them), each reproduced for real, each with its control.

Run as root and as the test user.  Traffic goes only to servers these tests start on
127.0.0.1.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity
from test_serve import Server, serve_extra

__all__ = ["serve_extra"]  # the fixture, imported for pytest

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


def _marks(who: Identity, request: dict[str, Any], mode: str) -> dict[str, int]:
    proc = subprocess.run([*who.prefix(), "-c", PRELOAD_RUNNER, mode], input=json.dumps(request),
                          env=who.environ(), cwd=who.tmp, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["status"] == "exited", res
    ws = Path(res["run"]["workspace"])
    return {p.name: p.stat().st_uid for p in ws.glob("ran-*")}


def test_a_requests_environment_never_reaches_corrals_init(who: Identity) -> None:
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
    assert not [m for m in marks if m.startswith("ran-python")], marks
    # The control: with the variables set by bwrap, as before, the init runs the library.
    marks = _marks(who, request, "unprotected")
    inits = [m for m in marks if m.startswith("ran-python")]
    assert inits, marks
    if who.is_root:  # code of the request's, as uid 0, in the process that drops to nobody
        assert any(m.endswith("-uid0") for m in inits) and 0 in marks.values(), marks


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
