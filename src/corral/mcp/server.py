"""``corral mcp``: corral's tools over MCP, with the official SDK (``pip install corral[mcp]``).

This module only speaks the protocol: :mod:`corral.mcp.tools` translates each call,
:mod:`corral.mcp.session` owns the workspaces, :func:`corral.execute.run_in` runs the
sandboxes.  What a session is depends on the transport:

* **stdio** has one client for the life of the process: one session, one workspace, removed
  when the client closes the pipe or the process is told to stop.  Both protocol eras work.
* **streamable HTTP** has one session per ``Mcp-Session-Id`` (the 2025-11-25 handshake era).
  The SDK ends a session's connection when the client deletes it, when it has been idle too
  long, or when the server stops, and unwinds the connection's exit stack: that removes the
  workspace.  The 2026-07-28 era has no sessions, so this server refuses ``server/discover``
  on HTTP (clients then fall back to the handshake) and refuses a tool call that comes
  without a session.

A tool call runs in a worker thread (the launcher blocks), one at a time per session and at
most one per core in all.  Whatever goes wrong in a call is a tool error with a one-line
reason; the server itself never stops for one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import __version__, httpauth
from ..errors import CorralError, UsageError
from . import session as sessions
from . import tools

__all__ = ["Front", "serve"]

log = logging.getLogger("corral.mcp")
STATE_KEY = "corral.session"


@dataclass
class Slot:
    """A session with the lock that keeps its calls one at a time."""

    session: sessions.Session
    lock: anyio.Lock = field(default_factory=anyio.Lock)


def _connection(ctx: Any) -> Connection | None:
    """The connection a request came on.  The SDK (2.3) gives handlers no public handle on
    it yet (its request context rework will); the request's session holds it."""
    conn = getattr(ctx, "connection", None) or getattr(ctx.session, "_connection", None)
    return conn if isinstance(conn, Connection) else None


class Front:
    """The MCP server: tool listing and calls, and the sessions they run in."""

    def __init__(self, server: sessions.Server, transport: str) -> None:
        self.sessions = server
        self.transport = transport
        self.runs = anyio.CapacityLimiter(max(os.cpu_count() or 1, 1))
        self.opening = anyio.Lock()
        self.stdio: Slot | None = None
        self.stopped_by: int | None = None  # the signal that stopped a stdio server
        self.mcp: Server[Any] = Server(
            "corral", version=__version__, instructions=tools.describe(server.policy),
            lifespan=self._lifespan, on_list_tools=self.list_tools, on_call_tool=self.call_tool)
        if transport == "http":
            self.mcp.add_request_handler("server/discover", types.RequestParams, _no_discover)

    @asynccontextmanager
    async def _lifespan(self, _: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            # Blocking on purpose: the server is stopping and this must not be cancelled.
            self.sessions.close()
            if self.stopped_by is not None:
                # Stopped by a signal, stdio's reader thread is still blocked reading the
                # pipe, and the process could not end before the client closed it.
                os._exit(128 + self.stopped_by)

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=name, description=tool.description, input_schema=tool.schema,
                       annotations=types.ToolAnnotations(
                           read_only_hint=tool.read_only,
                           open_world_hint=bool(self.sessions.policy.network.allow)))
            for name, tool in tools.TOOLS.items()])

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        try:
            slot = await self._slot(ctx)
            async with slot.lock:
                reply = await anyio.to_thread.run_sync(
                    tools.call, slot.session, params.name, params.arguments,
                    limiter=self.runs)
        except CorralError as e:
            return _error(str(e))
        except Exception as e:  # a bug in corral must not take the server (and others) down
            log.exception("tool %s failed", params.name)
            return _error(f"corral could not complete {params.name}; {type(e).__name__}: {e}; "
                          "this is a bug in corral, please report it")
        return types.CallToolResult(content=[types.TextContent(type="text",
                                                               text=json.dumps(reply))],
                                    structured_content=reply)

    async def _slot(self, ctx: Any) -> Slot:
        """The calling session's slot, made on its first call."""
        if self.transport == "stdio":
            async with self.opening:
                if self.stdio is None:
                    self.stdio = Slot(await anyio.to_thread.run_sync(self.sessions.open))
                return self.stdio
        conn = _connection(ctx)
        if conn is None:
            raise UsageError("corral cannot tell which MCP session this call belongs to",
                             "this version of the MCP SDK hides a request's connection",
                             "install the version corral is tested with: pip install "
                             "'mcp>=2.3,<2.4'")
        if conn.session_id is None or conn.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise UsageError("this call came without an MCP session",
                             "corral mcp keeps one workspace per session, and the 2026-07-28 "
                             "protocol has none",
                             "connect with the 2025-11-25 handshake (the SDK's Client does "
                             "when the server refuses server/discover, as this one does)")
        async with self.opening:
            slot: Slot | None = conn.state.get(STATE_KEY)
            if slot is None:
                slot = Slot(await anyio.to_thread.run_sync(self.sessions.open))
                conn.state[STATE_KEY] = slot
                conn.exit_stack.push_async_callback(self._end, slot)
            return slot

    async def _end(self, slot: Slot) -> None:
        with anyio.CancelScope(shield=True):
            async with slot.lock:  # a call still running finishes first
                await anyio.to_thread.run_sync(self.sessions.end, slot.session)


async def _no_discover(ctx: Any, params: Any) -> types.DiscoverResult:
    raise MCPError(code=-32601, message="server/discover is not served here: corral mcp keeps "
                   "a workspace per session; use the initialize handshake")


def _error(message: str) -> types.CallToolResult:
    """A tool error: one line (an exception's text may hold more), never a protocol error."""
    line = " ".join(message.split())
    return types.CallToolResult(content=[types.TextContent(type="text", text=line)],
                                is_error=True)


def rebinding_guard(host: str) -> TransportSecuritySettings | None:
    """The SDK's Host and Origin checks for a server on any loopback address (None: off
    loopback, where the token guards).  The SDK turns them on by itself for 127.0.0.1,
    localhost and ::1 only: bound to 127.0.0.2, a web page whose name was rebound to it
    reached the server, which needs no token there."""
    if not httpauth.is_loopback(host):
        return None
    names = ["127.0.0.1", "localhost", "[::1]"]
    bound = f"[{host}]" if ":" in host else host
    if bound not in names:
        names.append(bound)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[f"{n}:*" for n in names],
        allowed_origins=[f"http://{n}:*" for n in names])


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}", e.strerror or str(e),
                         "pick another --port, or free that one") from None
    return sock


async def _stdio(front: Front) -> None:
    """Serve stdio until the client closes the pipe, or SIGTERM, SIGINT or SIGHUP.

    Either way the lifespan removes the session; calls still running finish first (the SDK
    waits for its request tasks, and a run ends by its timeout at the latest)."""
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as got:
                async for signum in got:
                    front.stopped_by = signum
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch)
        async with stdio_server() as (read, write):
            await front.mcp.run(read, write, front.mcp.create_initialization_options())
        tg.cancel_scope.cancel()


async def _http(front: Front, sock: socket.socket, token: str | None, idle_s: float,
                max_sessions: int) -> None:
    import uvicorn

    from ..httpguard import protocol

    host, port = sock.getsockname()[:2]
    app: Any = front.mcp.streamable_http_app(
        host=host, session_idle_timeout=idle_s, max_sessions=max_sessions,
        transport_security=rebinding_guard(host))
    if token is not None:
        app = httpauth.RequireToken(app, token)
    shown = f"[{host}]" if ":" in host else host
    print(f"corral: mcp: listening on http://{shown}:{port}/mcp", file=sys.stderr, flush=True)
    # corral.httpguard: uvicorn alone waits for a request head forever (1,100 idle
    # connections used up a 1,024-descriptor server).
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=10, http=protocol())
    await uvicorn.Server(config).serve(sockets=[sock])


def serve(server: sessions.Server, transport: str, *, host: str = "127.0.0.1",
          port: int = 8000, token: str | None = None, idle_s: float = 1800,
          max_sessions: int = 8) -> None:
    """Serve MCP on ``transport`` ("stdio" or "http") until the client or a signal ends it;
    every session's workspace is removed on the way out."""
    front = Front(server, transport)
    with server:
        if transport == "stdio":
            print(f"corral: mcp: serving on stdio ({server.policy.name} profile)",
                  file=sys.stderr, flush=True)
            anyio.run(_stdio, front)
            return
        token = httpauth.required(token, host, "corral mcp")
        sock = _listen(host, port)
        # uvicorn handles SIGTERM and SIGINT itself: a graceful stop, the SDK's sessions
        # ended (their workspaces removed), then the lifespan's cleanup.
        with sock:
            anyio.run(_http, front, sock, token, idle_s, max_sessions)
