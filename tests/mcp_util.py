"""Driving ``corral mcp`` with the MCP SDK's own client, over stdio and streamable HTTP, as
root or as the test user.  The servers are real ``corral mcp`` processes; every address is
127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import Identity, need

CALL_LIMIT_S = 300  # generous: the machine is shared and loaded


def deps(shared_tmp: Path) -> Path:
    """The MCP SDK, installed where the test user can read it, for /usr/bin/python3.

    The user cannot read the checkout's .venv (CI clones under /root), so the SDK the tests
    use is installed again, at the same version, into a world-readable directory: from
    pip's cache when the .venv was just built, else from PyPI."""
    from importlib import metadata

    target = shared_tmp / "mcp-deps"
    if not target.exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--target", str(target), f"mcp=={metadata.version('mcp')}"],
            capture_output=True, text=True, timeout=900, check=False)
        need(done.returncode == 0, f"cannot install the MCP SDK for the test user: "
             f"{done.stderr.strip()[-500:]}")
        for p in [target, *target.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    return target


def environ(who: Identity, sdk: Path | None, extra: dict[str, str] | None = None
            ) -> dict[str, str]:
    env = who.environ(extra)
    if who.src is not None and sdk is not None:
        env["PYTHONPATH"] = f"{who.src}:{sdk}"
    return env


def argv(who: Identity, *args: str) -> list[str]:
    return [*who.prefix(), "-m", "corral", "mcp", *args]


def corral_mcp(who: Identity, sdk: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``corral mcp ARGS`` as ``who``, to its end (for options that stop it at once)."""
    return subprocess.run(argv(who, *args), cwd=who.tmp, env=environ(who, sdk),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, check=False)


@contextlib.asynccontextmanager
async def stdio_client(who: Identity, sdk: Path | None, *args: str,
                       env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """An SDK client connected to ``corral mcp ARGS``, started on stdio as ``who``."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client as transport

    cmd = argv(who, *args)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=str(who.tmp),
                                   env=environ(who, sdk, env))
    with open(who.tmp / f"mcp-stderr-{os.urandom(4).hex()}.log", "w") as log:
        async with Client(transport(params, errlog=log)) as client:
            yield client


class HttpServer:
    """``corral mcp --transport http --port 0`` as ``who``; its URL read from stderr."""

    def __init__(self, who: Identity, sdk: Path | None, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv(who, "--transport", "http", "--port", "0", *args), cwd=who.tmp,
            env=environ(who, sdk, env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        self.url = self._url()

    def _url(self) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 120
        seen = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 1)
            if ready:
                line = self.proc.stderr.readline()
                seen += line
                if "listening on " in line:
                    return line.split("listening on ", 1)[1].strip()
                if not line and self.proc.poll() is not None:
                    break
        self.stop()
        raise AssertionError(f"corral mcp did not start: {seen}")

    def client(self, **kwargs: Any) -> Any:
        from mcp import Client

        return Client(self.url, **kwargs)

    def stop(self) -> int:
        """SIGTERM, as a service manager would; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode


@contextlib.contextmanager
def http_server(who: Identity, sdk: Path | None, *args: str,
                env: dict[str, str] | None = None) -> Iterator[HttpServer]:
    server = HttpServer(who, sdk, *args, env=env)
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def connect(who: Identity, sdk: Path | None, transport: str, *args: str,
                  env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A connected client to a fresh server over ``transport``: stdio or http."""
    if transport == "stdio":
        async with stdio_client(who, sdk, *args, env=env) as client:
            yield client
        return
    with http_server(who, sdk, *args, env=env) as server:
        async with server.client() as client:
            yield client


def run(main: Any) -> Any:
    """Run the coroutine function ``main`` with a generous overall limit."""
    async def limited() -> Any:
        with anyio.fail_after(CALL_LIMIT_S):
            return await main()

    return anyio.run(limited)


async def call(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool call that must succeed; its structured reply."""
    res = await client.call_tool(tool, args)
    text = res.content[0].text if res.content else ""
    assert not res.is_error, f"{tool} failed: {text}"
    reply: dict[str, Any] = res.structured_content
    assert json.loads(text) == reply
    return reply


async def refused(client: Any, tool: str, args: dict[str, Any]) -> str:
    """A tool call that must be a tool error; its one-line reason."""
    res = await client.call_tool(tool, args)
    assert res.is_error, f"{tool} {args} was not refused: {res.content}"
    text: str = res.content[0].text
    assert "\n" not in text and text, text
    return text


def workspaces(who: Identity) -> list[Path]:
    """The session workspaces under ``who``'s runs directory."""
    return sorted((who.tmp / "runs").glob("mcp-*/*/work"))


def eventually(check: Any, timeout: float = 60) -> bool:
    """Whether ``check()`` holds within ``timeout`` seconds: a session's end is noticed by
    the server a moment after its client has gone."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def servers(who: Identity) -> list[Path]:
    return sorted((who.tmp / "runs").glob("mcp-*"))


@pytest.fixture(scope="session")
def sdk(shared_tmp: Path, readable_src: Path) -> Path | None:
    """The SDK for the test user (None when tests run as that user already)."""
    need(_has_sdk(), "the MCP SDK is not installed: make setup installs corral[mcp]")
    if os.geteuid() != 0:
        return None
    return deps(shared_tmp)


def _has_sdk() -> bool:
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True
