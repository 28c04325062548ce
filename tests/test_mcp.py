"""``corral mcp`` end to end: the MCP SDK's own client, over stdio and streamable HTTP, as
root and as the test user, against real ``corral mcp`` processes and the real bwrap.

Each protection runs beside its negative control: the same attempt with the protection
removed (a plain bwrap, a server started with the variable or the name allowed, the
launcher following the link itself) succeeds, so no test passes vacuously.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, processes_with, raw_bwrap
from egress_util import Origin
from mcp_util import (
    call,
    connect,
    corral_mcp,
    eventually,
    http_server,
    refused,
    run,
    sdk,
    servers,
    stdio_client,
    workspaces,
)

pytestmark = pytest.mark.sandbox
__all__ = ["sdk"]  # the fixture, imported for pytest

TRANSPORTS = pytest.mark.parametrize("transport", ["stdio", "http"])
PIN = ("--allow-domain", "origin.test", "--resolve", "origin.test:127.0.0.1")
ENV_PROBE = """
import glob, os
seen = []
for f in glob.glob("/proc/[0-9]*/environ"):
    try:
        seen.append(open(f, "rb").read().decode(errors="replace"))
    except OSError:
        pass
print(repr(dict(os.environ)), *seen)
"""
FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] if len(sys.argv) > 1 else {url!r}, timeout=20)
          .read().decode())
except Exception as e:
    print("FAILED", type(e).__name__)
"""


def _outside(who: Identity) -> list[Path]:
    outside = who.tmp / "outside"
    outside.mkdir()
    who.chown(outside)
    return [outside / "x", Path("/usr/corral-mcp-x"), Path("/etc/corral-mcp-x"),
            Path("/corral-mcp-x"), Path("/var/tmp/corral-mcp-x")]


@TRANSPORTS
def test_a_tool_call_runs_inside_the_sandbox(who: Identity, sdk: Path | None, bwrap: str,
                                              transport: str) -> None:
    targets = _outside(who)
    canary = f"CANARY-{uuid.uuid4().hex}"
    writes = "; ".join(f"(echo pwn > {t}) 2>/dev/null && echo WROTE {t}" for t in targets)

    async def main(origin: Origin) -> None:
        async with connect(who, sdk, transport, env={"CORRAL_CANARY": canary}) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"run_code", "run_command", "read_file", "write_file", "list_files"}
            wrote = await call(client, "run_command", {"command": writes + "; echo ok > in"})
            assert wrote["exit_code"] == 0 and "WROTE" not in wrote["stdout"], wrote
            assert [c["path"] for c in wrote["files_changed"]] == ["in"]
            env = await call(client, "run_code", {"language": "python", "code": ENV_PROBE})
            assert "'HOME': '/work'" in env["stdout"] and canary not in env["stdout"]
            net = await call(client, "run_code", {"language": "python", "code": FETCH.format(
                url=f"http://127.0.0.1:{origin.port}/")})
            assert net["stdout"].startswith("FAILED"), net

    with Origin() as origin:
        run(lambda: main(origin))
        assert origin.connections == 0
    for t in targets:
        assert not t.exists(), f"{t} was created on the host"
    # Negative control: a plain bwrap with the directory bound writable writes there.
    ctl = raw_bwrap(bwrap, ["--bind", str(targets[0].parent), str(targets[0].parent)],
                    ["/bin/sh", "-c", f"echo pwn > {targets[0]}"])
    assert ctl.returncode == 0 and targets[0].read_text() == "pwn\n"


def test_the_servers_flags_are_the_only_way_in(who: Identity, sdk: Path | None) -> None:
    """Negative control of the environment and network checks above: a server started with
    the variable passed and the name allowed lets the same calls through."""
    canary = f"CANARY-{uuid.uuid4().hex}"

    async def main(origin: Origin) -> None:
        async with connect(who, sdk, "stdio", "--env", "CORRAL_CANARY", *PIN,
                           env={"CORRAL_CANARY": canary}) as client:
            env = await call(client, "run_code", {"language": "python", "code": ENV_PROBE})
            assert canary in env["stdout"]
            net = await call(client, "run_code", {"language": "python", "code": FETCH.format(
                url=f"http://origin.test:{origin.port}/")})
            assert net["stdout"].startswith("GET / host=origin.test"), net

    with Origin() as origin:
        run(lambda: main(origin))
        assert origin.connections == 1


FORKER = """
import os, sys, time
started = 0
for _ in range(40):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        started += 1
    except OSError:
        break
print(started, flush=True)
"""
BOMB = """
import os, sys
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
HOG = """
chunks = []
while len(chunks) < {n}:
    chunks.append(bytearray(1 << 20))
print("survived", len(chunks))
"""


def test_a_fork_bomb_and_a_memory_hog_are_contained(who: Identity, sdk: Path | None) -> None:
    marker = f"corral-mcp-bomb-{uuid.uuid4().hex}"

    async def tight() -> None:
        async with connect(who, sdk, "stdio", "--pids", "16", "--memory", "64M",
                           "--cpus", "0.5") as client:
            forks = await call(client, "run_code", {"language": "python", "code": FORKER})
            assert forks["exit_code"] == 0 and int(forks["stdout"]) < 16
            bomb = await call(client, "run_code", {"language": "python", "timeout_s": 5,
                                                   "code": BOMB + f"# {marker}"})
            assert bomb["status"] == "timeout" and bomb["exit_code"] == 124
            hog = await call(client, "run_code", {"language": "python",
                                                  "code": HOG.format(n=4096)})
            assert hog["status"] == "oom" and "survived" not in hog["stdout"]
            assert hog["peak_memory_bytes"] <= 64 << 20

    async def roomy() -> None:  # negative control: the same calls under room enough
        async with connect(who, sdk, "stdio", "--pids", "64", "--memory", "512M") as client:
            forks = await call(client, "run_code", {"language": "python", "code": FORKER})
            assert int(forks["stdout"]) == 40
            hog = await call(client, "run_code", {"language": "python",
                                                  "code": HOG.format(n=128)})
            assert hog["status"] == "exited" and hog["stdout"] == "survived 128\n"

    run(tight)
    assert processes_with(marker) == []
    run(roomy)


@TRANSPORTS
def test_a_sessions_files_persist_between_calls_and_are_gone_after(
        who: Identity, sdk: Path | None, transport: str) -> None:
    async def session(client: Any) -> None:
        await call(client, "write_file", {"path": "data/in.txt", "content": "21\n"})
        code = "print(int(open('data/in.txt').read()) * 2); open('out.txt', 'w').write('x')"
        ran = await call(client, "run_code", {"language": "python", "code": code,
                                              "files": {"lib/helper.py": "K = 1\n"}})
        assert ran["stdout"] == "42\n" and ran["ok"] is True
        assert {c["path"] for c in ran["files_changed"]} == {"out.txt"}
        got = await call(client, "read_file", {"path": "out.txt"})
        assert got == {"path": "out.txt", "size": 1, "content": "x"}
        listed = await call(client, "list_files", {})
        assert {e["path"] for e in listed["entries"]} >= {
            "data", "data/in.txt", "lib", "lib/helper.py", "main.py", "out.txt"}
        again = await call(client, "run_command", {"argv": ["cat", "out.txt", "data/in.txt"]})
        assert again["stdout"] == "x21\n"
        assert len(workspaces(who)) == 1

    if transport == "stdio":
        async def main() -> None:
            async with stdio_client(who, sdk) as client:
                await session(client)
        run(main)
    else:
        with http_server(who, sdk) as server:
            async def main() -> None:
                async with server.client() as client:
                    await session(client)
            run(main)
            # The client ended its session; the server lives on, without the workspace.
            assert eventually(lambda: workspaces(who) == []) and len(servers(who)) == 1
    assert eventually(lambda: servers(who) == [])


def test_two_sessions_cannot_see_each_others_files(who: Identity, sdk: Path | None) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    # Anywhere the sandbox can see, by name; and by content wherever a payload can write.
    look = ("find / -name mine.txt 2>/dev/null; ls -a /work; "
            f"grep -rl {secret} /work /tmp /dev/shm 2>/dev/null; exit 0")

    async def main(server: Any) -> None:
        async with server.client() as a, server.client() as b:
            await call(a, "write_file", {"path": "mine.txt", "content": secret})
            seen = await call(b, "run_command", {"command": look, "timeout_s": 120})
            assert secret not in seen["stdout"] and "mine.txt" not in seen["stdout"]
            assert "cannot read 'mine.txt'" in await refused(b, "read_file",
                                                             {"path": "mine.txt"})
            assert (await call(b, "list_files", {}))["entries"] == []
            assert len(workspaces(who)) == 2
            # Negative control: the session that wrote it finds it, by the same means.
            own = await call(a, "run_command", {"command": look, "timeout_s": 120})
            assert "/work/mine.txt" in own["stdout"]
            assert (await call(a, "read_file", {"path": "mine.txt"}))["content"] == secret

    with http_server(who, sdk) as server:
        run(lambda: main(server))
        assert eventually(lambda: workspaces(who) == []), workspaces(who)


def _planted(who: Identity) -> tuple[Path, Path]:
    """A host file and directory the server's identity can read, outside any workspace."""
    host_dir = who.tmp / "host"
    host_dir.mkdir()
    (host_dir / "secret").write_text("HOST-SECRET\n")
    host_dir.chmod(0o777)  # even the payload's own uid could write here, were it reachable
    (host_dir / "secret").chmod(0o666)
    return host_dir / "secret", host_dir


@TRANSPORTS
def test_path_escapes_are_refused(who: Identity, sdk: Path | None, transport: str) -> None:
    secret, host_dir = _planted(who)
    plant = (f"ln -s {secret} link; ln -s {host_dir} dir; mkdir real; ln -s ../.. real/up; "
             "mkfifo pipe")
    attempts: list[tuple[str, dict[str, Any], str]] = [
        ("read_file", {"path": "link"}, "symbolic link"),
        ("read_file", {"path": "dir/secret"}, "symbolic link"),
        ("read_file", {"path": "real/up/x"}, "symbolic link"),
        ("read_file", {"path": "../x"}, "not a plain relative path"),
        ("read_file", {"path": str(secret)}, "is absolute"),
        ("write_file", {"path": "link", "content": "PWNED"}, "symbolic link"),
        ("write_file", {"path": "dir/new", "content": "PWNED"}, "symbolic link"),
        ("write_file", {"path": "a/../../x", "content": "PWNED"}, "not a plain relative"),
        ("list_files", {"path": "dir"}, "symbolic link"),
        ("list_files", {"path": ".."}, "not a plain relative path"),
        ("read_file", {"path": "pipe"}, "it is a fifo"),
        ("write_file", {"path": "pipe", "content": "x"}, "it is a fifo"),
        ("run_code", {"language": "python", "code": "", "files": {"dir/f": "PWNED"}},
         "symbolic link"),
    ]
    naive: list[str] = []

    async def main() -> None:
        async with connect(who, sdk, transport) as client:
            await call(client, "run_command", {"command": plant})
            for tool, args, why in attempts:
                reason = await refused(client, tool, args)
                assert why in reason, (tool, args, reason)
            listed = await call(client, "list_files", {})
            kinds = {e["path"]: e["type"] for e in listed["entries"]}
            assert kinds["link"] == kinds["dir"] == kinds["real/up"] == "symlink"
            # Negative control: a launcher that opens the names itself lands on the host.
            ws = workspaces(who)[0]
            naive.append((ws / "link").read_text())
            naive.append((ws / "dir" / "secret").read_text())

    run(main)
    assert naive == ["HOST-SECRET\n", "HOST-SECRET\n"]
    assert secret.read_text() == "HOST-SECRET\n" and sorted(os.listdir(host_dir)) == ["secret"]


def test_bad_arguments_get_a_tool_error_and_the_server_lives_on(who: Identity,
                                                               sdk: Path | None) -> None:
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("no_such_tool", {}, "unknown tool"),
        ("run_code", {"language": "python"}, "needs code"),
        ("run_code", {"language": "cobol", "code": "x"}, "not supported"),
        ("run_code", {"language": "python", "code": "x", "bogus": 1}, "unknown key 'bogus'"),
        ("run_code", {"language": "python", "code": 3}, "must be a string"),
        ("run_code", {"language": "python", "code": "", "timeout_s": -1}, "positive"),
        ("run_code", {"language": "python", "code": "", "timeout_s": "1h"}, "positive"),
        ("run_code", {"language": "python", "code": "", "files": {"main.py": ""}}, "collides"),
        ("run_code", {"language": "python", "code": "", "stdin": {"base64": "%%"}}, "base64"),
        ("run_command", {}, "exactly one of argv and command"),
        ("run_command", {"argv": ["ls"], "command": "ls"}, "exactly one"),
        ("run_command", {"argv": "ls"}, "list of strings"),
        ("run_command", {"argv": ["/no/such/program"]}, "/no/such/program"),
        ("read_file", {}, "needs path"),
        ("read_file", {"path": "nothing-here"}, "no such file"),
        ("write_file", {"path": "f"}, "needs content"),
        ("list_files", {"path": 7}, "non-empty string"),
    ]

    async def main() -> None:
        async with connect(who, sdk, "stdio", "--timeout", "20") as client:
            for tool, args, why in bad:
                reason = await refused(client, tool, args)
                assert why in reason, (tool, args, reason)
            # The server is fine, and a timeout above its own is lowered to it ...
            capped = await call(client, "run_command", {"argv": ["true"], "timeout_s": 3600})
            assert capped["ok"] and capped["timeout_s"] == 20
            # ... while one below it holds (the negative control: asking does change it).
            short = await call(client, "run_command", {"argv": ["sleep", "30"],
                                                       "timeout_s": 1})
            assert short["status"] == "timeout" and short["timeout_s"] == 1

    run(main)


def _post(url: str, token: str | None = None, host: str | None = None) -> int:
    """A bare MCP initialize over HTTP: the status the server answers with."""
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}}).encode()
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if host is not None:
        headers["Host"] = host
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers),
                                    timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_http_takes_a_token_and_needs_one_off_loopback(who: Identity, sdk: Path | None) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    token = uuid.uuid4().hex
    token_file = who.tmp / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    who.chown(token_file)

    async def with_token(url: str) -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            assert (await call(client, "run_command", {"argv": ["true"]}))["ok"]

    with http_server(who, sdk, "--token-file", str(token_file)) as server:
        assert _post(server.url) == 401 and _post(server.url, "wrong" * 8) == 401
        assert _post(server.url, token) == 200
        run(lambda: with_token(server.url))
    # Negative control: without a token the same bare request is served.
    with http_server(who, sdk) as server:
        assert _post(server.url) == 200
        # A page elsewhere that got its name resolved to 127.0.0.1 (DNS rebinding) is refused.
        assert _post(server.url, host="rebound.example:80") == 421
    off = corral_mcp(who, sdk, "--transport", "http", "--host", "0.0.0.0", "--port", "0")
    assert off.returncode == 125 and "needs a token" in off.stderr
    assert off.stderr.count("\n") == 1
    token_file.chmod(0o644)
    shared = corral_mcp(who, sdk, "--transport", "http", "--token-file", str(token_file))
    assert shared.returncode == 125 and "chmod 600" in shared.stderr


def test_http_refuses_calls_without_a_session(who: Identity, sdk: Path | None) -> None:
    """The 2026-07-28 protocol has no sessions, so no workspace to keep: refused, with the
    fix.  (The default client, used everywhere else here, falls back to the handshake.)"""
    async def main(server: Any) -> None:
        async with server.client(mode="2026-07-28") as client:
            assert len((await client.list_tools()).tools) == 5
            reason = await refused(client, "run_command", {"argv": ["true"]})
            assert "without an MCP session" in reason and "2025-11-25" in reason
        async with server.client() as client:  # negative control: with a session, it runs
            assert (await call(client, "run_command", {"argv": ["true"]}))["ok"]

    with http_server(who, sdk) as server:
        run(lambda: main(server))


def test_a_stopped_stdio_server_removes_its_workspace(who: Identity, sdk: Path | None) -> None:
    runs = who.tmp / "runs"
    stopped: list[bool] = []

    async def main() -> None:
        async with stdio_client(who, sdk, "--runs-dir", str(runs)) as client:
            await call(client, "write_file", {"path": "f", "content": "x"})
            assert len(workspaces(who)) == 1
            (pid,) = processes_with(f"--runs-dir\0{runs}")
            os.kill(pid, 15)
            stopped.append(eventually(lambda: servers(who) == []))

    with contextlib.suppress(Exception):  # the client sees its server go away mid-session
        run(main)
    assert stopped == [True]
    assert eventually(lambda: processes_with(f"--runs-dir\0{runs}") == [])


def test_a_killed_servers_directory_goes_at_the_next_start(who: Identity,
                                                            sdk: Path | None) -> None:
    import fcntl

    runs = who.tmp / "runs"
    for name in ("mcp-dead", "mcp-live", "mcp-starting", "not-mcp"):
        (runs / name / "s" / "work").mkdir(parents=True)
        (runs / name / "s" / "work" / "file").write_text("left behind")
    for name in ("mcp-dead", "mcp-live", "not-mcp"):
        (runs / name / ".lock").touch()
    for p in [runs, *runs.rglob("*")]:
        os.lchown(p, who.uid, who.gid)
    with open(runs / "mcp-live" / ".lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live server holds its lock

        async def main() -> None:
            async with stdio_client(who, sdk) as client:
                await call(client, "list_files", {})

        run(main)
    left = sorted(p.name for p in runs.iterdir())
    # The dead one went; the live one (the negative control), one without a lock yet and
    # what is not a server's stayed.
    assert left == ["mcp-live", "mcp-starting", "not-mcp"]


def test_the_disk_limit_holds_for_the_whole_session(who: Identity, sdk: Path | None) -> None:
    chunk = {"base64": __import__("base64").b64encode(b"\0" * (700 << 10)).decode()}

    async def tight() -> None:
        async with stdio_client(who, sdk, "--disk", "1M") as client:
            await call(client, "write_file", {"path": "a", "content": chunk})
            reason = await refused(client, "write_file", {"path": "b", "content": chunk})
            assert "disk limit" in reason
            grown = await call(client, "run_command", {
                "command": "head -c 700000 /dev/zero > c"})
            assert not grown["ok"], grown
            ws = workspaces(who)[0]
            used = sum(p.stat().st_blocks * 512 for p in ws.rglob("*"))
            assert used <= (1 << 20) + (64 << 10), used

    async def roomy() -> None:  # negative control: the same writes where they fit
        async with stdio_client(who, sdk, "--disk", "8M") as client:
            for name in ("a", "b"):
                await call(client, "write_file", {"path": name, "content": chunk})
            assert (await call(client, "run_command", {
                "command": "head -c 700000 /dev/zero > c"}))["ok"]

    run(tight)
    run(roomy)


@pytest.mark.parametrize("args,why", [
    (["--profile", "claude"], "does not serve the 'claude' profile"),
    (["--max-sessions", "0"], "positive"),
    (["--idle-timeout", "soon"], "not a duration"),
    (["--transport", "carrier-pigeon"], "invalid choice"),
    (["--timeout", "-1"], "timeout"),
])
def test_bad_server_options_are_one_line_and_exit_125(who: Identity, sdk: Path | None,
                                                      args: list[str], why: str) -> None:
    proc = corral_mcp(who, sdk, *args)
    assert proc.returncode == 125 and why in proc.stderr, proc.stderr
    assert proc.stderr.startswith("corral: error: ") and proc.stderr.count("\n") == 1
    assert servers(who) == []


def test_a_workspace_corral_made_may_hold_what_its_payload_wrote(who: Identity,
                                                                 sdk: Path | None) -> None:
    """A folder named like credentials (.ssh) in a workspace corral made came from its own
    payload: the session goes on, as a compile-then-run request does.  The check still
    refuses such a directory when the user names it with --workspace (the control)."""
    async def main() -> None:
        async with stdio_client(who, sdk) as client:
            await call(client, "run_command", {"command": "mkdir .ssh && echo k > .ssh/config"})
            again = await call(client, "run_command", {"argv": ["cat", ".ssh/config"]})
            assert again["stdout"] == "k\n"
            compiled = await call(client, "run_code", {"language": "c",
                                                       "code": "int main(void){return 0;}"})
            assert compiled["ok"], compiled

    run(main)
    mine = who.tmp / "project"
    (mine / ".ssh").mkdir(parents=True)
    who.chown(mine)
    named = who.corral("run", "--workspace", str(mine), "--", "/bin/true")
    assert named.returncode == 125 and "holds credentials (.ssh)" in named.stderr


def test_a_compile_steps_workspace_may_hold_credential_named_files(bwrap: str,
                                                                   tmp_path: Path) -> None:
    """The same rule for a c request: its run reuses the compile step's workspace."""
    import corral

    req = corral.RunRequest.from_json({"code": "int main(void){return 0;}", "language": "c",
                                       "files": {".ssh/config": "k"}})
    res = corral.run(req, runs_dir=str(tmp_path / "runs"))
    assert res.status == "exited" and res.ok, res.error
