"""The host-side proxy of one run: asyncio, standard library, no listening socket.

Clients reach it only through the bridge (:mod:`corral.egress.bridge`),
which passes each connection accepted inside the sandbox over a unix socket
pair.  For each connection the proxy:

 1. reads the first bytes: ``0x05`` is SOCKS5, ``0x04`` (SOCKS4) is refused,
    anything else is an HTTP request head; a connection accepted on a relayed
    loopback port (:class:`~corral.egress.rules.Relay`) has no head at all:
    its target is the port's rule;
 2. opens the target (:mod:`.opener`: decide, resolve, admit, connect);
 3. answers (``200``, a SOCKS reply, or a denial) and relays
    (:mod:`corral.egress.relay`).

Every decision goes to the run's :class:`DecisionLog`, and every client that
sent a byte gets an answer: a request that cannot be read in time, ends
early, or makes the proxy fail in any way is answered (400, 408 or a SOCKS
failure) and logged, never dropped, and nothing is printed.  A client that
sends its head slowly is read less and less often (:mod:`.handshake`), so
trickled bytes cost a bounded number of wake-ups, and the run's
:class:`~corral.egress.account.Account` pauses this run's proxy when its CPU
share is spent.  Every socket is owned by exactly one of the connection,
its tunnel, or the proxy's set of open connections.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import http
from .account import Account
from .handshake import Conn, Target, read_request
from .log import DecisionLog
from .opener import Opened, Opener, Refused, Resolver, bad_request, system_resolver
from .relay import Tunnel
from .rules import Code, Decision, Relay, Rules, parse_host

__all__ = ["Proxy", "Resolver", "Run", "system_resolver"]

CPU_TICK_S = 0.1  # how often the proxy charges its CPU time to the run
FD_MESSAGE = 16  # descriptors accepted per control message; the bridge sends one


@dataclass(slots=True)
class Run:
    """What belongs to one run: its rules, its decision log, its account."""

    rules: Rules
    log: DecisionLog
    account: Account


class Proxy:
    """One run's proxy; runs on one event loop, in the session's thread."""

    def __init__(self, run: Run, resolver: Resolver, max_connections: int) -> None:
        self.run = run
        self.resolver = resolver
        self.max_connections = max_connections
        self.relays = {(r.listen, r.port): r for r in run.rules.relays()}
        self.buffer = bytearray(1 << 20)  # shared by every pump: loop thread only
        self.open: dict[socket.socket, asyncio.Task[None] | Tunnel | None] = {}
        self.failures = 0  # exceptions that were the proxy's fault (each answered and logged)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.opener: Opener | None = None
        self.ctrl: _socket.socket | None = None  # the session's pair: a plain _socket
        self.marks = (0.0, 0.0)  # wall clock and this thread's CPU time at the last tick

    # -- control socket: descriptors from the bridge ---------------------------

    def attach(self, loop: asyncio.AbstractEventLoop, ctrl: _socket.socket) -> None:
        self.loop, self.ctrl = loop, ctrl
        self.opener = Opener(loop, self.run.rules, self.run.account, self.resolver)
        loop.set_exception_handler(self._loop_error)
        ctrl.setblocking(False)
        loop.add_reader(ctrl.fileno(), self._receive)
        self.marks = (time.monotonic(), time.thread_time())
        loop.call_later(CPU_TICK_S, self._tick)

    def _tick(self) -> None:
        """Charge this thread's CPU time to the run; pause while the run's share is spent.

        The loop serves this run only, so sleeping it pauses exactly this run's
        egress (a proxy shared between runs would pause only the indebted run's
        sockets instead).
        """
        now, cpu = time.monotonic(), time.thread_time()
        pause = self.run.account.charge_cpu(cpu - self.marks[1], now - self.marks[0])
        self.marks = (now, cpu)  # the pause itself counts as time the share accrues over
        if pause > 0:
            self.run.account.paused += pause
            time.sleep(pause)
        assert self.loop is not None
        self.loop.call_later(CPU_TICK_S, self._tick)

    def _receive(self) -> None:
        assert self.ctrl is not None
        while True:
            try:
                # Close-on-exec from the start: no child of this process (bwrap, git, a
                # program embedding corral) may inherit a payload's socket.
                data, ancdata, _, _ = self.ctrl.recvmsg(16, socket.CMSG_SPACE(4 * FD_MESSAGE),
                                                        socket.MSG_CMSG_CLOEXEC)
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
        relay = self._relay_of(sock)
        self.open[sock] = None
        self.open[sock] = self.loop.create_task(
            self._client(Conn(self.loop, sock, self.run.account)) if relay is None
            else self._relayed(sock, relay))

    def _relay_of(self, sock: socket.socket) -> Relay | None:
        """The relay whose listening address accepted ``sock`` (the kernel says which)."""
        if not self.relays:
            return None
        try:
            address, port = sock.getsockname()[:2]
            return self.relays.get((ipaddress.ip_address(address), port))
        except (OSError, ValueError):
            return None

    # -- one client -----------------------------------------------------------

    async def _client(self, conn: Conn) -> None:
        tunnel = None
        try:
            tunnel = await self._handle(conn)
        except Refused as e:
            self._log(conn, e.decision)
            await conn.answer(e)
        except OSError as e:  # the client is gone: no one is left to answer
            self._log(conn, bad_request("the client's connection failed before its request "
                                        f"was answered ({e.strerror or type(e).__name__})")
                      .decision)
        except Exception as e:  # a bug in corral: still one answer and one log line
            self.failures += 1
            refused = bad_request(f"corral's proxy failed on this request ({type(e).__name__})")
            self._log(conn, refused.decision)
            await conn.answer(refused)
        finally:
            if tunnel is None:  # else the tunnel gives it back once its first bytes are out
                conn.release()
            self._settle(conn.sock, tunnel)

    def _log(self, conn: Conn, decision: Decision) -> None:
        """A connection's one log line (none for one that never sent a byte)."""
        if conn.received and not conn.logged:
            conn.logged = True
            self._record(conn.protocol, decision)

    async def _relayed(self, sock: socket.socket, relay: Relay) -> None:
        """A connection to a relayed loopback port: a tunnel to the port's rule, no head."""
        tunnel = None
        assert self.opener is not None
        try:
            opened = await self.opener.open(relay.target, relay.port)
            self._record("relay", opened.decision)
            tunnel = await self._join(sock, opened, Target(relay.target, relay.port, b"", None,
                                                           b""))
        except Refused as e:
            self._record("relay", e.decision)
        except OSError:
            pass
        except Exception as e:
            self.failures += 1
            self._record("relay", bad_request(f"corral's proxy failed ({type(e).__name__})")
                         .decision)
        finally:
            self._settle(sock, tunnel)

    def _settle(self, sock: socket.socket, tunnel: Tunnel | None) -> None:
        if tunnel is None:
            self._forget(sock)
            sock.close()
        elif not tunnel.closed:
            self.open[sock] = tunnel

    async def _handle(self, conn: Conn) -> Tunnel | None:
        target = await read_request(conn)
        if target is None:
            return None  # closed without a byte: nothing to decide or answer
        assert self.opener is not None
        opened = await self.opener.open(target.host, target.port)
        self._log(conn, opened.decision)
        return await self._join(conn.sock, opened, target, conn.release)

    async def _send(self, sock: socket.socket, data: bytes) -> None:
        assert self.loop is not None
        await self.loop.sock_sendall(sock, data)

    async def _join(self, sock: socket.socket, opened: Opened, target: Target,
                    release: Callable[[], None] | None = None) -> Tunnel:
        """Answer the client, then hand both sockets (and what the request holds of the
        run's budget, given back by ``release``) to a tunnel that owns them."""
        try:
            if target.answer:
                await self._send(sock, target.answer)
        except BaseException:  # cancelled or failed: the upstream socket is still ours
            opened.upstream.close()
            self.run.account.release_buffer(opened.buffer)
            raise
        assert self.loop is not None
        req = target.request
        tunnel = Tunnel(self.loop, self.buffer, sock, opened.upstream, self._closed,
                        body=None if req is None else req.body_length, window=opened.buffer,
                        on_error=self._tunnel_error, on_sent=release)
        # The target was allowed, so its host parses; the head names it in normal form.
        head = b"" if req is None else http.upstream_head(req, str(parse_host(req.host)))
        tunnel.start(head, target.early)
        return tunnel

    def _closed(self, tunnel: Tunnel) -> None:
        self.run.account.release_buffer(tunnel.grant)
        self._forget(tunnel.client)

    def _tunnel_error(self, tunnel: Tunnel, error: Exception) -> None:
        self.failures += 1
        self._record("tunnel", Decision(False, Code.BAD_REQUEST, f"corral's proxy failed while "
                                        f"relaying ({type(error).__name__}); tunnel closed"))

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Anything else that escapes: logged as one line, never printed as a traceback."""
        self.failures += 1
        error = context.get("exception")
        what = type(error).__name__ if error is not None else str(context.get("message"))
        self._record("unknown", Decision(False, Code.BAD_REQUEST,
                                         f"corral's proxy failed ({what[:80]})"))

    def _forget(self, sock: socket.socket) -> None:
        self.open.pop(sock, None)

    def _record(self, protocol: str, decision: Decision) -> None:
        self.run.log.record(protocol, decision)

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
        if self.opener is not None:
            self.opener.close()


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
