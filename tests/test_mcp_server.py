"""``corral mcp`` as a server: sessions kept apart over HTTP, the token, the protocol era,
stopping and restarting, bad options.  Real servers, the MCP SDK's own client, as root and as
the test user; each protection beside its negative control.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, processes_with
from mcp_util import (
    call,
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
    os.chown(token_file, who.uid, who.gid)  # the server's own user's (corral.httpauth)

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


def test_a_compile_steps_workspace_may_hold_credential_named_files(bwrap: str,
                                                                   tmp_path: Path) -> None:
    """The same rule for a c request: its run reuses the compile step's workspace."""
    import corral

    req = corral.RunRequest.from_json({"code": "int main(void){return 0;}", "language": "c",
                                       "files": {".ssh/config": "k"}})
    res = corral.run(req, runs_dir=str(tmp_path / "runs"))
    assert res.status == "exited" and res.ok, res.error


def test_an_idle_http_session_ends_and_its_workspace_goes(who: Identity,
                                                          sdk: Path | None) -> None:
    """A client that leaves without ending its session: the idle timeout ends it."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def leave_open(url: str) -> None:
        async with Client(streamable_http_client(url, terminate_on_close=False)) as client:
            await call(client, "write_file", {"path": "f", "content": "x"})

    with http_server(who, sdk, "--idle-timeout", "3") as server:
        run(lambda: leave_open(server.url))
        assert eventually(lambda: workspaces(who) == [], timeout=120)
    # Negative control: with the default timeout (30 minutes) the same session stays.
    with http_server(who, sdk) as server:
        run(lambda: leave_open(server.url))
        time.sleep(6)
        assert len(workspaces(who)) == 1
    assert workspaces(who) == []  # and goes when the server stops
