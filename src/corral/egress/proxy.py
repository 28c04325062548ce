"""The host-side proxy of one run: asyncio, standard library, no listening socket.

Clients reach it only through the bridge (:mod:`corral.egress.bridge`),
which passes each connection accepted inside the sandbox over a unix socket
pair.  For each connection the proxy:

 1. reads the first bytes: ``0x05`` is SOCKS5, ``0x04`` (SOCKS4) is refused,
    anything else is an HTTP request head;
 2. decides on the target as written (:meth:`Rules.decide`), before any
    name is resolved, so a refused name never reaches a resolver;
 3. resolves the name on the host (or takes its ``--resolve`` pin), checks
    every address (:meth:`Rules.admit`), and connects to exactly the
    address it checked: nothing is resolved twice, so DNS rebinding
    between the check and the connection is impossible;
 4. answers (``200``, a SOCKS reply, or a denial) and relays
    (:mod:`corral.egress.relay`).

Every decision goes to the :class:`DecisionLog`.  Nothing a client sends can
stop the proxy: every connection is handled in its own task, every failure
ends that connection only, and every socket is owned by exactly one of the
connection, its tunnel, or the proxy's set of open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from . import http, socks
from .log import DecisionLog
from .relay import Tunnel
from .rules import Code, Decision, IPAddress, Rules, parse_host

__all__ = ["Proxy", "Resolver", "system_resolver"]

Resolver = Callable[[str, int], Sequence[IPAddress]]
HANDSHAKE_TIMEOUT_S = 30.0  # from connection to decision: slow or silent clients are dropped
CONNECT_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 15.0
MAX_LOOKUPS = 16  # name lookups in flight at once (each is a thread)
READ_CHUNK = 64 * 1024
FD_MESSAGE = 16  # descriptors accepted per control message; the bridge sends one


def system_resolver(name: str, port: int) -> list[IPAddress]:
    """The host's resolver (``getaddrinfo``): TCP addresses of ``name``, in its order."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addr = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
            if addr not in found:
                found.append(addr)
    return found


class Refused(Exception):
    """A connection is refused: HTTP status or SOCKS reply, and the decision to log."""

    def __init__(self, decision: Decision, status: int = 403) -> None:
        super().__init__(decision.reason)
        self.decision = decision
        self.status = status


class Proxy:
    """One session's proxy; runs on one event loop, in the session's thread."""

    def __init__(self, rules: Rules, log: DecisionLog, resolver: Resolver,
                 max_connections: int) -> None:
        self.rules = rules
        self.log = log
        self.resolver = resolver
        self.max_connections = max_connections
        self.buffer = bytearray(1 << 20)  # shared by every pump: loop thread only
        self.open: dict[socket.socket, asyncio.Task[None] | Tunnel | None] = {}
        self.lookups: asyncio.Semaphore | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ctrl: socket.socket | None = None

    # -- control socket: descriptors from the bridge ---------------------------

    def attach(self, loop: asyncio.AbstractEventLoop, ctrl: socket.socket) -> None:
        self.loop, self.ctrl = loop, ctrl
        self.lookups = asyncio.Semaphore(MAX_LOOKUPS)
        ctrl.setblocking(False)
        loop.add_reader(ctrl.fileno(), self._receive)

    def _receive(self) -> None:
        assert self.ctrl is not None
        while True:
            try:
                data, ancdata, _, _ = self.ctrl.recvmsg(16, socket.CMSG_SPACE(4 * FD_MESSAGE))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, ancdata = b"", []
            fds = _descriptors(ancdata)
            if not data and not fds:  # the sandbox's end is closed: no more clients
                self._detach()
                return
            for fd in fds:
                self._adopt(fd)

    def _detach(self) -> None:
        if self.ctrl is not None and self.loop is not None:
            self.loop.remove_reader(self.ctrl.fileno())

    def _adopt(self, fd: int) -> None:
        """Own one received descriptor: a TCP socket becomes a client, anything else is closed."""
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            _close_fd(fd)
            return
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                  socket.AF_INET6):
            sock.close()
            return
        if len(self.open) >= self.max_connections:
            self._record("unknown", Decision(False, Code.BAD_REQUEST,
                                             f"over {self.max_connections} connections open"))
            sock.close()
            return
        sock.setblocking(False)
        assert self.loop is not None
        self.open[sock] = None
        self.open[sock] = self.loop.create_task(self._client(sock))

    # -- one client -----------------------------------------------------------

    async def _client(self, sock: socket.socket) -> None:
        tunnel = None
        data = b""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                data = await self._recv(sock)
                if not data:
                    return
                if data[0] == socks.VERSION:
                    tunnel = await self._socks(sock, data)
                elif data[0] == 4:
                    await self._send(sock, bytes((0, 0x5B, 0, 0, 0, 0, 0, 0)))
                    self._record("socks4", Decision(False, Code.BAD_REQUEST,
                                                    "SOCKS4 is not supported; use SOCKS5"))
                else:
                    tunnel = await self._http(sock, data)
        except TimeoutError:
            if data:  # a connection opened and never used is not worth a log line
                self._record("unknown", Decision(False, Code.BAD_REQUEST,
                                                 "the client sent no complete request in time"))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if tunnel is None:
                self._forget(sock)
                sock.close()
            elif not tunnel.closed:
                self.open[sock] = tunnel

    async def _recv(self, sock: socket.socket) -> bytes:
        assert self.loop is not None
        return await self.loop.sock_recv(sock, READ_CHUNK)

    async def _send(self, sock: socket.socket, data: bytes) -> None:
        assert self.loop is not None
        await self.loop.sock_sendall(sock, data)

    async def _http(self, sock: socket.socket, data: bytes) -> Tunnel | None:
        while b"\r\n\r\n" not in data[:http.MAX_HEAD + 4]:
            if len(data) > http.MAX_HEAD:
                break
            more = await self._recv(sock)
            if not more:
                return None
            data += more
        end = data.find(b"\r\n\r\n")
        head, early = (data, b"") if end < 0 else (data[:end + 4], data[end + 4:])
        protocol = "http-connect" if head.startswith(b"CONNECT ") else "http"
        try:
            req = http.parse_request(head)
            decision, upstream = await self._open(req.host, req.port)
        except http.BadRequest as e:
            decision = Decision(False, e.code, e.reason)
            self._record(protocol, decision)
            await self._send(sock, http.deny_response(e.status, e.code, e.reason))
            return None
        except Refused as e:
            self._record(protocol, e.decision)
            await self._send(sock, http.deny_response(e.status, e.decision.code,
                                                      e.decision.reason))
            return None
        self._record(protocol, decision)
        if req.tunnel:
            return await self._join(sock, upstream, b"HTTP/1.1 200 Connection established\r\n"
                                    b"\r\n", b"", early, None)
        head = http.upstream_head(req, str(parse_host(req.host)))
        return await self._join(sock, upstream, b"", head, early, req.body_length)

    async def _socks(self, sock: socket.socket, data: bytes) -> Tunnel | None:
        try:
            while (greeting := socks.parse_greeting(data)) is None:
                data += await self._need(sock)
            used, accepted = greeting
            await self._send(sock, socks.greeting_reply(accepted))
            if not accepted:
                self._record("socks5", Decision(False, Code.BAD_REQUEST, "the client offers no "
                                                "SOCKS method corral accepts (no auth)"))
                return None
            data = data[used:]
            while (request := socks.parse_request(data)) is None:
                data += await self._need(sock)
            used, host, port = request
            decision, upstream = await self._open(host, port)
        except socks.SocksError as e:
            self._record("socks5", Decision(False, Code.BAD_REQUEST, e.reason))
            await self._send(sock, socks.reply(e.reply_code))
            return None
        except Refused as e:
            self._record("socks5", e.decision)
            await self._send(sock, socks.reply(socks.REPLY_FOR.get(e.decision.code,
                                                                   socks.GENERAL_FAILURE)))
            return None
        self._record("socks5", decision)
        return await self._join(sock, upstream, socks.reply(socks.SUCCEEDED), b"",
                                data[used:], None)

    async def _need(self, sock: socket.socket) -> bytes:
        more = await self._recv(sock)
        if not more:
            raise asyncio.IncompleteReadError(b"", None)
        return more

    async def _join(self, sock: socket.socket, upstream: socket.socket, answer: bytes,
                    head: bytes, early: bytes, body: int | None) -> Tunnel | None:
        """Answer the client, then hand both sockets to a tunnel that owns them."""
        try:
            if answer:
                await self._send(sock, answer)
        except BaseException:  # cancelled or failed: the upstream socket is still ours
            upstream.close()
            raise
        assert self.loop is not None
        tunnel = Tunnel(self.loop, self.buffer, sock, upstream, self._closed, body=body)
        tunnel.start(head, early)
        return tunnel

    def _closed(self, tunnel: Tunnel) -> None:
        self._forget(tunnel.client)

    def _forget(self, sock: socket.socket) -> None:
        self.open.pop(sock, None)

    # -- deciding and connecting ------------------------------------------------

    async def _open(self, host: str, port: int) -> tuple[Decision, socket.socket]:
        """Decide, resolve, admit, connect; raises Refused.  Returns the connected socket."""
        decision = self.rules.decide(host, port)
        if not decision.allowed:
            raise Refused(decision)
        target = parse_host(host)
        addresses: Sequence[IPAddress]
        pinned = self.rules.pinned(target)
        if target.ip is not None:
            addresses = [target.ip]
        elif pinned is not None:
            addresses = [pinned]
        else:
            addresses = await self._resolve(decision, target.name, decision.port or port)
        decision = self.rules.admit(decision, addresses)
        if not decision.allowed:
            raise Refused(decision)
        return decision, await self._connect(decision)

    async def _resolve(self, decision: Decision, name: str, port: int) -> Sequence[IPAddress]:
        assert self.loop is not None and self.lookups is not None
        future: asyncio.Future[Sequence[IPAddress]] = self.loop.create_future()
        loop = self.loop

        def lookup() -> None:  # in a daemon thread: a hung resolver never blocks shutdown
            try:
                result: Any = self.resolver(name, port)
                ok = True
            except (OSError, UnicodeError, ValueError) as e:
                result, ok = e, False
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(_settle, future, ok, result)

        async with self.lookups:
            threading.Thread(target=lookup, name="corral-resolve", daemon=True).start()
            try:
                async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                    return await future
            except (OSError, TimeoutError, UnicodeError, ValueError) as e:
                why = "timed out" if isinstance(e, TimeoutError) else (
                    getattr(e, "strerror", None) or str(e) or type(e).__name__)
                raise Refused(decision.refuse(Code.UNRESOLVED,
                                              f"{name} could not be resolved: {why}"),
                              502) from None

    async def _connect(self, decision: Decision) -> socket.socket:
        assert self.loop is not None and decision.address is not None
        addr = ipaddress.ip_address(decision.address)
        family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self.loop.sock_connect(upstream, (str(addr), decision.port))
        except BaseException as e:
            upstream.close()
            if not isinstance(e, OSError | TimeoutError):
                raise
            why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            failed = Decision(False, Code.UNREACHABLE,
                              f"{decision.host}:{decision.port} ({addr}) is allowed, but "
                              f"the connection failed: {why}", decision.host, decision.port,
                              str(addr), decision.rule)
            raise Refused(failed, 502) from None
        return upstream

    def _record(self, protocol: str, decision: Decision) -> None:
        self.log.record(protocol, decision)

    # -- shutdown ----------------------------------------------------------------

    async def shutdown(self) -> None:
        """Close every connection and tunnel; the loop can stop after this."""
        self._detach()
        tasks = [t for t in self.open.values() if isinstance(t, asyncio.Task)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for owner in list(self.open.values()):
            if isinstance(owner, Tunnel):
                owner.close()
        for sock in list(self.open):
            sock.close()
        self.open.clear()


def _settle(future: asyncio.Future[Sequence[IPAddress]], ok: bool, result: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(result)
    else:
        future.set_exception(result)


def _descriptors(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, usable, 4)]
    return fds


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
