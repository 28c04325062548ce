"""``corral serve``: the real server (uvicorn) on 127.0.0.1, driven the way its users call it.

The server runs as root and as the test user.  The user cannot read the checkout's venv, so
its server runs the system python with corral's readable copy and a world-readable copy of
the serve extra's pure-Python packages (uvicorn, h11, click), made once per session.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
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

from conftest import Identity, need

pytestmark = pytest.mark.sandbox
SERVE_PACKAGES = ("uvicorn", "h11", "click")


@pytest.fixture(scope="session")
def serve_extra(shared_tmp: Path) -> Path:
    """The serve extra's packages, readable by every identity."""
    dest = shared_tmp / "serve-extra"
    for name in SERVE_PACKAGES:
        spec = importlib.util.find_spec(name)
        need(spec is not None and spec.origin is not None, f"{name} (corral[serve]) installed")
        assert spec is not None and spec.origin is not None
        shutil.copytree(Path(spec.origin).parent, dest / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # other modules use it too
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    def __init__(self, who: Identity, extra: Path, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.who, self.port = who, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runs = who.tmp / f"runs-{self.port}"
        path = f"{who.src}:{extra}" if who.src else str(extra)
        self.log = open(who.tmp / f"serve-{self.port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*who.prefix(), "-m", "corral", "serve", "--port", str(self.port), "--runs-dir",
             str(self.runs), *args], env=who.environ({"PYTHONPATH": path, **(env or {})}),
            cwd=who.tmp,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                if self.get("/healthz")[0] == 200:
                    break
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)

    def output(self) -> str:
        self.log.flush()
        return (self.who.tmp / f"serve-{self.port}.log").read_text()

    def post(self, path: str, body: Any, token: str | None = None, raw: bytes | None = None,
             timeout: float = 120) -> tuple[int, Any, dict[str, str]]:
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        return self._open(req, timeout)

    def get(self, path: str, token: str | None = None) -> tuple[int, Any, dict[str, str]]:
        req = urllib.request.Request(self.url + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        return self._open(req, 30)

    @staticmethod
    def _open(req: urllib.request.Request, timeout: float) -> tuple[int, Any, dict[str, str]]:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read()), dict(resp.headers)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read()), dict(e.headers)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.log.close()


@pytest.fixture
def server(who: Identity, serve_extra: Path) -> Iterator[Server]:
    s = Server(who, serve_extra, "--max-timeout", "20")
    yield s
    s.stop()


RESPONSE_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name",
                 "files"}
STEP_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}


def test_run_code_answers_like_sandboxfusion(server: Server) -> None:
    status, r, _ = server.post("/run_code", {
        "code": "import sys; d = open('in.txt').read(); open('out.txt', 'w').write(d * 2);"
                "print(sys.stdin.read().upper())",
        "language": "python", "stdin": "abc", "run_timeout": 10, "compile_timeout": 10,
        "memory_limit_MB": 256, "files": {"in.txt": base64.b64encode(b"xy").decode(),
                                          "skipped.txt": None},
        "fetch_files": ["out.txt", "missing.txt"]})
    assert status == 200 and set(r) == RESPONSE_KEYS and set(r["run_result"]) == STEP_KEYS
    assert (r["status"], r["message"], r["compile_result"]) == ("Success", "", None)
    assert r["run_result"]["status"] == "Finished" and r["run_result"]["return_code"] == 0
    assert r["run_result"]["stdout"] == "ABC\n" and r["run_result"]["execution_time"] > 0
    assert r["files"] == {"out.txt": base64.b64encode(b"xyxy").decode()}
    _, cpp, _ = server.post("/run_code", {"code": "#include <cstdio>\nint main(){return 3;}",
                                          "language": "cpp"})
    assert cpp["status"] == "Failed" and cpp["compile_result"]["return_code"] == 0
    assert cpp["run_result"]["return_code"] == 3
    _, broken, _ = server.post("/run_code", {"code": "int main() { nope }", "language": "c"})
    assert broken["status"] == "Failed" and broken["run_result"] is None
    assert broken["compile_result"]["return_code"] != 0
    _, slow, _ = server.post("/run_code", {"code": "sleep 30", "language": "bash",
                                           "run_timeout": 1})
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["return_code"] is None
    status, many, _ = server.post("/run_code/batch", [
        {"code": f"print({i})", "language": "python"} for i in range(4)])
    assert status == 200 and [m["run_result"]["stdout"] for m in many] == ["0\n", "1\n", "2\n",
                                                                            "3\n"]
    assert server.get("/metrics")[1]["runs"] == 8
    assert not any(server.runs.iterdir()), "no workspace left behind"


def test_corral_requests_and_bad_ones(server: Server) -> None:
    status, r, _ = server.post("/v1/runs", {"id": "x", "command": ["/bin/echo", "hi"]})
    assert status == 200 and r["id"] == "x" and r["run"]["stdout"] == "hi\n"
    bad = [("/run_code", {"code": "x", "language": "java"}, "not supported"),
           ("/run_code", {"code": "x", "language": "python", "run_timout": 1}, "run_timeout"),
           ("/run_code", {"language": "python"}, "code is required"),
           ("/run_code", {"code": "x", "language": "python", "files": {"../x": "eA=="}},
            "relative"),
           ("/run_code/batch", {"code": "x"}, "list"),
           ("/v1/runs", {"command": ["/bin/true"], "limits": {"timeout": 50}}, "maximum"),
           ("/v1/runs", {"command": ["/bin/true"], "network": {"allow": ["example.com"]}},
            "not allowed by this server"),
           ("/v1/runs", {"command": ["/bin/true"], "profile": "claude"}, "cannot be requested")]
    for path, body, says in bad:
        status, r, _ = server.post(path, body)
        assert status == 400 and says in r["error"], (path, body, r)
    assert server.post("/v1/runs", None, raw=b"{nope")[0] == 400
    assert server.post("/v1/runs", None, raw=b"x" * (33 << 20))[0] == 413
    assert server.get("/nowhere")[0] == 404 and server.get("/run_code")[0] == 405
    assert server.get("/metrics")[1]["bad_requests"] >= len(bad)


def test_per_request_limits_are_capped(server: Server) -> None:
    """--max-timeout 20: a SandboxFusion client's 1000 s becomes 20 s; corral's own API says no
    (the control: the same request under the cap runs as asked)."""
    t0 = time.monotonic()
    _, r, _ = server.post("/run_code", {"code": "sleep 60", "language": "bash",
                                        "run_timeout": 1000}, timeout=300)
    assert r["run_result"]["status"] == "TimeLimitExceeded"
    assert 15 < r["run_result"]["execution_time"] < 40 and time.monotonic() - t0 < 120
    assert server.post("/v1/runs", {"command": ["/bin/sleep", "1"],
                                    "limits": {"timeout": 1000}})[0] == 400
    status, ok, _ = server.post("/v1/runs", {"command": ["/bin/sleep", "1"],
                                             "limits": {"timeout": 19}})
    assert status == 200 and ok["status"] == "exited"


def test_a_token_is_required_when_given_and_elsewhere(who: Identity, serve_extra: Path) -> None:
    token = "t0ken-" + os.urandom(12).hex()
    tf = who.tmp / "token"
    tf.write_text(token + "\n")
    os.chown(tf, who.uid, who.gid)  # the server's own user's (corral.httpauth)
    tf.chmod(0o600)
    s = Server(who, serve_extra, "--token-file", str(tf))
    try:
        job = {"command": ["/bin/true"]}
        assert s.post("/v1/runs", job)[0] == 401
        assert s.post("/v1/runs", job, token="wrong-" + token)[0] == 401
        assert s.post("/v1/runs", job, token=token)[0] == 200
        assert s.get("/metrics")[0] == 401 and s.get("/metrics", token=token)[0] == 200
    finally:
        s.stop()
    # Bound anywhere but loopback, no token is refused before anything listens.
    refused = who.corral("serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode == 125 and "needs a token" in refused.stderr


def test_a_full_queue_answers_429(who: Identity, serve_extra: Path) -> None:
    def burst(s: Server) -> list[tuple[int, dict[str, str]]]:
        job = {"code": "sleep 3", "language": "bash"}
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: s.post("/run_code", job), range(4)))
        return [(status, headers) for status, _, headers in got]

    small = Server(who, serve_extra, "--workers", "1", "--queue", "1")
    try:
        answers = burst(small)
        busy = [h for status, h in answers if status == 429]
        assert busy and all(h.get("retry-after") == "1" for h in busy), answers
        assert small.get("/metrics")[1]["rejected"] == len(busy)
    finally:
        small.stop()
    # The control: with room in the queue, the same burst is all answered.
    roomy = Server(who, serve_extra, "--workers", "1", "--queue", "8")
    try:
        assert [status for status, _ in burst(roomy)] == [200] * 4
    finally:
        roomy.stop()


# --- under load, the way veRL's sandbox-fusion client calls it ---------------------------

MAX_RETRIES = 3


def call_sandbox_api(url: str, code: str, stdin: str, language: str, timeout: int = 10
                     ) -> dict[str, Any]:
    """veRL's call pattern: a POST per test case, timeout = compile + run + 10, retries with
    a growing delay on 504 only."""
    payload = json.dumps({"compile_timeout": timeout, "run_timeout": timeout, "code": code,
                          "stdin": stdin, "language": language, "files": {},
                          "fetch_files": []}).encode()
    for attempt in range(MAX_RETRIES):
        req = urllib.request.Request(url, data=payload, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout * 2 + 10) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        except urllib.error.HTTPError as e:
            e.close()
            if e.code != 504:
                raise
            time.sleep(attempt + 1)
    raise AssertionError("504 after every retry")


def census(pid: int) -> tuple[int, list[int]]:
    """The server's open descriptors and its descendant processes."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return fds, sorted(found)


def settled(pid: int) -> tuple[int, list[int]]:
    """:func:`census` once it holds still: a closed connection's descriptor goes a moment
    after its client left (keep-alive connections within uvicorn's 5 s)."""
    last, deadline = census(pid), time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(1)
        now = census(pid)
        if now == last and now[1] == []:
            break
        last = now
    return last


def cgroups_of(uid: int) -> set[str]:
    base = Path(f"/sys/fs/cgroup/pids/corral/uid-{uid}")
    return {p.name for p in base.iterdir() if p.is_dir()} if base.is_dir() else set()


class RunIds(threading.Thread):
    """The run ids of a server's runs, seen in its runs directory while they live: the
    names of their cgroups (other sessions' runs on this machine share the hierarchy)."""

    def __init__(self, runs: Path) -> None:
        super().__init__(daemon=True)
        self.runs, self.seen, self.done = runs, set[str](), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            with contextlib.suppress(OSError):
                for req in os.listdir(self.runs):
                    self.seen.update(os.listdir(self.runs / req))


PROGRAMS = [("python", "n = int(input()); print(n * n)"), ("bash", "read n; echo $((n * n))")]


def test_a_thousand_requests_from_64_clients(who: Identity, serve_extra: Path) -> None:
    s = Server(who, serve_extra, "--queue", "256")
    try:
        url = s.url + "/run_code"
        call_sandbox_api(url, "print(1)", "", "python")  # warm: the census counts steady state
        fds_before, procs_before = settled(s.proc.pid)
        ids = RunIds(s.runs)
        ids.start()
        failures: list[Any] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            language, code = PROGRAMS[i % len(PROGRAMS)]
            r = call_sandbox_api(url, code, str(i), language)
            if r["status"] != "Success" or r["run_result"]["stdout"] != f"{i * i}\n":
                with lock:
                    failures.append((i, r))

        with ThreadPoolExecutor(64) as pool:
            list(pool.map(one, range(1000)))
        ids.done.set()
        ids.join()
        assert failures == [], failures[:3]
        metrics = s.get("/metrics")[1]
        assert metrics["runs"] == 1001 and metrics["failures"] == 0
        assert metrics["latency_s"]["p99"] is not None
        fds_after, procs_after = settled(s.proc.pid)
        assert fds_after <= fds_before and procs_after == procs_before == [], \
            "no descriptor or process left"
        assert len(ids.seen) > 100, "the census saw the runs"
        assert not cgroups_of(who.uid) & ids.seen, "no cgroup left behind"
        assert not any(s.runs.iterdir()), "no workspace left behind"
    finally:
        s.stop()
