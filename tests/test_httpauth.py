"""One bearer-token scheme for ``corral serve`` and ``corral mcp --transport http``
(corral.httpauth): the same sources, the same checks before anything listens, the same
header, the same refusal.  Each server runs as root and as the test user, on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from conftest import NOBODY, Identity
from corral import httpauth
from mcp_util import HttpServer, sdk
from mcp_util import argv as mcp_argv
from mcp_util import environ as mcp_environ
from test_serve import Server, free_port, serve_extra

__all__ = ["sdk", "serve_extra"]  # the fixtures, imported for pytest

MCP_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "t", "version": "1"}}}).encode()
MCP_HEADERS = [("Content-Type", "application/json"),
               ("Accept", "application/json, text/event-stream")]


class Front:
    """One of the two servers, started as ``who``, with what a protected request is."""

    def __init__(self, kind: str, who: Identity, extra: Path | None) -> None:
        self.kind, self.who, self.extra = kind, who, extra

    def start(self, *args: str, env: dict[str, str] | None = None) -> Any:
        if self.kind == "serve":
            assert self.extra is not None
            return Server(self.who, self.extra, *args, env=env)
        return HttpServer(self.who, self.extra, *args, env=env)

    def command(self, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str] | None:
        """The server with ``args``, when it stops by itself within 30 s (None: it runs)."""
        if self.kind == "serve":
            assert self.extra is not None
            path = f"{self.who.src}:{self.extra}" if self.who.src else str(self.extra)
            cmd = [*self.who.prefix(), "-m", "corral", "serve", "--port", str(free_port()),
                   "--runs-dir", str(self.who.tmp / "runs"), *args]
            environ = self.who.environ({"PYTHONPATH": path, **(env or {})})
        else:
            cmd = mcp_argv(self.who, "--transport", "http", "--port", "0", *args)
            environ = mcp_environ(self.who, self.extra, env)
        try:
            return subprocess.run(cmd, env=environ, cwd=self.who.tmp, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return None  # it started (or hung): either way it took the setting

    def ask(self, server: Any, headers: list[tuple[str, str]]) -> tuple[int, Any, Any]:
        """A request only a token holder may make: status, JSON body, headers."""
        url = urllib.parse.urlsplit(server.url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        try:
            if self.kind == "serve":
                conn.putrequest("GET", "/metrics")
            else:
                conn.putrequest("POST", url.path)
                headers = [*MCP_HEADERS, ("Content-Length", str(len(MCP_INIT))), *headers]
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(MCP_INIT if self.kind == "mcp" else None)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, json.loads(body) if resp.status == 401 else None, resp.headers
        finally:
            conn.close()


@pytest.fixture(params=["serve", "mcp"])
def front(request: Any, who: Identity) -> Front:
    extra = request.getfixturevalue("serve_extra" if request.param == "serve" else "sdk")
    return Front(request.param, who, extra)


def _token_file(who: Identity, token: str, mode: int = 0o600) -> Path:
    path = who.tmp / f"token-{os.urandom(4).hex()}"
    path.write_text(token + "\n")
    os.chown(path, who.uid, who.gid)  # the server's own user
    path.chmod(mode)
    return path


def test_both_servers_check_one_token_the_same_way(front: Front) -> None:
    """From a file or $CORRAL_TOKEN: no token, a wrong one, a second Authorization header
    and another scheme get the same 401; the token, in any case of "Bearer", gets in.
    Before, serve took its file only and mcp also an environment variable, and each
    refused in its own words."""
    token = "t0ken-" + os.urandom(16).hex()
    for source in ("file", "env"):
        args = ("--token-file", str(_token_file(front.who, token))) if source == "file" else ()
        server = front.start(*args, env={"CORRAL_TOKEN": token} if source == "env" else None)
        try:
            for headers in ([], [("Authorization", f"Bearer {token}x")],
                            [("Authorization", f"Basic {token}")],
                            [("Authorization", f"Bearer {token}"), ("Authorization", "Bearer x")]):
                status, body, got = front.ask(server, headers)
                assert (status, body) == (401, {"error": httpauth.REFUSED}), (source, headers)
                assert got["www-authenticate"] == "Bearer"
            for scheme in ("Bearer", "bearer"):  # the control: the token gets in
                assert front.ask(server, [("Authorization", f"{scheme} {token}")])[0] == 200
        finally:
            server.stop()


def _refused(front: Front, what: str, *args: str, env: dict[str, str] | None = None) -> None:
    done = front.command(*args, env=env)
    assert done is not None, f"{front.kind} started with {args} {env}"
    assert done.returncode == 125 and what in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_both_servers_refuse_a_bad_token_before_listening(front: Front) -> None:
    """Serve read any --token-file it could open: one every local user can read (0644), one
    another user can rewrite, a symlink; a FIFO there hung its start for ever.  An empty
    $CORRAL_MCP_TOKEN left corral mcp open without a word.  Each is now one error line."""
    who, token = front.who, "t0ken-" + os.urandom(16).hex()
    good = _token_file(who, token)
    for mode in (0o644, 0o640, 0o602):
        _refused(front, "chmod 600", "--token-file", str(_token_file(who, token, mode)))
    link = who.tmp / f"link-{os.urandom(4).hex()}"
    link.symlink_to(good)
    _refused(front, "cannot read --token-file", "--token-file", str(link))
    fifo = who.tmp / f"fifo-{os.urandom(4).hex()}"
    os.mkfifo(fifo, 0o600)
    os.chown(fifo, who.uid, who.gid)
    _refused(front, "not a regular file", "--token-file", str(fifo))
    if who.is_root:  # only root can hand a file to another user
        theirs = _token_file(who, token)
        os.chown(theirs, NOBODY, NOBODY)
        _refused(front, "belongs to another user", "--token-file", str(theirs))
    _refused(front, "too short", "--token-file", str(_token_file(who, "short")))
    _refused(front, "too short", env={"CORRAL_TOKEN": token[:8] + " " + token})
    _refused(front, "set but empty", env={"CORRAL_TOKEN": ""})
    _refused(front, "rename it to $CORRAL_TOKEN", env={"CORRAL_MCP_TOKEN": token})
    for host in ("0.0.0.0", "::", "corral-test.invalid"):
        _refused(front, "needs a token", "--host", host)
    # The control: the same file, owner-only, is taken (the server runs).
    assert front.command("--token-file", str(good)) is None


def test_the_rules_by_themselves() -> None:
    assert httpauth.is_loopback("127.0.0.1") and httpauth.is_loopback("::1")
    assert httpauth.is_loopback("127.0.0.2") and httpauth.is_loopback("localhost")
    for host in ("0.0.0.0", "::", "192.0.2.1", "localhost.example", "127.1", ""):
        assert not httpauth.is_loopback(host), host
    assert httpauth.required(None, "127.0.0.1", "x") is None
    assert httpauth.required("a" * 32 + "\n", "0.0.0.0", "x") == "a" * 32
    token = "b" * 20
    assert httpauth.authorized([(b"authorization", b"Bearer " + token.encode())], token)
    assert httpauth.authorized([(b"Authorization", b"BEARER  " + token.encode())], token)
    for value in (b"", b"Bearer", b"Bearer " + token.encode()[:-1], b"Bearer" + token.encode(),
                  b"Token " + token.encode(), b"Bearer " + token.encode() + b"b"):
        assert not httpauth.authorized([(b"authorization", value)], token), value
    env = {"CORRAL_TOKEN": token}
    assert httpauth.read_token(None, env) == token and env == {}  # no child inherits it
