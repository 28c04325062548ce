"""Reading one client's request, in HTTP or SOCKS5, and answering it in its own protocol.

A request head is read incrementally (:class:`~corral.egress.http.HeadReader`)
and, while it is unfinished, less and less often: the first read happens
at once, then each wait doubles from 1 ms up to 250 ms (``HEAD_PACE_S``).
A client that trickles its head one byte at a time therefore costs a
bounded number of wake-ups however fast it sends, and one that has not
sent a complete request after ``HEAD_TIMEOUT_S`` is answered 408.  Every
malformed, incomplete or refused request becomes a :class:`Refused` with
the status or SOCKS reply it is answered with.

Every byte read is held against the run's budget for request bytes
(:meth:`Account.hold`) until the connection's tunnel has sent it on, or the
connection ends: a read past the budget is answered 503.  No frame keeps a
chunk the head reader has already copied, so what is held is what is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from . import http, socks
from .account import HOLD_BUDGET, Account
from .opener import Refused, bad_request
from .rules import Decision

__all__ = ["HEAD_PACE_S", "HEAD_TIMEOUT_S", "Conn", "Target", "read_request"]

HEAD_TIMEOUT_S = 10.0  # from connection to a complete request (slowloris)
HEAD_PACE_S = (0.001, 0.25)  # waits between reads of an unfinished head: doubling, up to
READ_CHUNK = 64 * 1024
_SOCKS4_REFUSED = bytes((0, 0x5B, 0, 0, 0, 0, 0, 0))


class Target(NamedTuple):
    """A request read from a client: where to, and what to send once connected."""

    host: str
    port: int
    answer: bytes  # to the client
    request: http.Request | None  # plain HTTP: its head goes to the origin first
    early: bytes  # client bytes read past the request


class Conn:
    """One client connection during its handshake, on the proxy's event loop."""

    __slots__ = ("account", "greeted", "held", "logged", "loop", "pace", "protocol",
                 "received", "sock")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 account: Account) -> None:
        self.loop = loop
        self.sock = sock
        self.account = account
        self.held = 0  # bytes read and held against the run's budget
        self.protocol = "http"
        self.received = False  # a connection that never sent a byte is not logged
        self.logged = False  # its one log line is written
        self.greeted = False  # SOCKS: the method reply went out
        self.pace = HEAD_PACE_S[0]

    async def recv(self) -> bytes:
        data = await self.loop.sock_recv(self.sock, READ_CHUNK)
        self.received = self.received or bool(data)  # refused or not, it is logged
        if not self.account.hold(len(data)):
            raise bad_request(f"the run's proxy already holds {HOLD_BUDGET >> 20} MiB of "
                              "unfinished requests; this one is refused", 503)
        self.held += len(data)
        return data

    def release(self) -> None:
        """Give what this connection held back to the run (once its bytes are sent on)."""
        self.account.unhold(self.held)
        self.held = 0

    async def more(self) -> bytes:
        """More of an unfinished request, read after a wait that doubles each time."""
        await asyncio.sleep(self.pace)
        self.pace = min(self.pace * 2, HEAD_PACE_S[1])
        more = await self.recv()
        if not more:
            raise bad_request("the client closed the connection before its request was "
                              "complete")
        return more

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def answer(self, refused: Refused) -> None:
        """Tell the client why, in its own protocol; a client that is gone is not an error."""
        d = refused.decision
        if self.protocol == "socks5":
            answer = socks.reply(refused.socks_reply or socks.REPLY_FOR.get(
                d.code, socks.GENERAL_FAILURE)) if self.greeted else socks.greeting_reply(False)
        elif self.protocol == "socks4":
            answer = _SOCKS4_REFUSED
        else:
            answer = http.deny_response(refused.status, d.code, d.reason)
        with contextlib.suppress(OSError):
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                await self.send(answer)


async def read_request(conn: Conn) -> Target | None:
    """The client's request, or None if it closed without a byte; raises Refused."""
    async with _head_time():
        first = await conn.recv()
        if not first:
            return None
        version, pending = first[0], [first]
        del first  # the parser owns the chunk now (see the module docstring)
        if version == socks.VERSION:
            conn.protocol = "socks5"
            return await _socks(conn, pending.pop())
        if version == 4:
            conn.protocol = "socks4"
            raise bad_request("SOCKS4 is not supported; use SOCKS5")
        return await _http(conn, pending)


@contextlib.asynccontextmanager
async def _head_time() -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            yield
    except TimeoutError:
        raise bad_request(f"the client sent no complete request in {HEAD_TIMEOUT_S:g} s",
                          408) from None


async def _http(conn: Conn, pending: list[bytes]) -> Target:
    reader = http.HeadReader()
    done = _step(reader.feed, pending.pop())
    while done is None:  # each chunk is copied into the reader and dropped at once
        done = _step(reader.feed, await conn.more())
    head, early = done
    if head.startswith(b"CONNECT "):
        conn.protocol = "http-connect"
    req = _step(http.parse_request, head)
    if req.tunnel:
        return Target(req.host, req.port, b"HTTP/1.1 200 Connection established\r\n\r\n",
                      None, early)
    return Target(req.host, req.port, b"", req, early)


async def _socks(conn: Conn, first: bytes) -> Target:
    data = first
    while (greeting := _socks_step(socks.parse_greeting, data)) is None:
        data += await conn.more()
    used, accepted = greeting
    if not accepted:
        raise bad_request("the client offers no SOCKS method corral accepts (no auth)")
    await conn.send(socks.greeting_reply(True))
    conn.greeted = True
    data = data[used:]
    while (request := _socks_step(socks.parse_request, data)) is None:
        data += await conn.more()
    used, host, port = request
    return Target(host, port, socks.reply(socks.SUCCEEDED), None, data[used:])


def _step(parse: Any, data: Any) -> Any:
    """One HTTP parsing step; a malformed request becomes a refusal with its status."""
    try:
        return parse(data)
    except http.BadRequest as e:
        raise Refused(Decision(False, e.code, e.reason), e.status) from None


def _socks_step(parse: Any, data: bytes) -> Any:
    try:
        return parse(data)
    except socks.SocksError as e:
        raise bad_request(e.reason, socks_reply=e.reply_code) from None
