"""From a target as a client wrote it to a connected upstream socket, or a refusal.

For each target the opener:

 1. decides on the target as written (:meth:`Rules.decide`), before any name
    is resolved, so a refused name never reaches a resolver;
 2. resolves the *absolute* name on the host (``name.``, so the host's DNS
    search domains never turn ``ghost.cdn.test`` into ``ghost.cdn.test.corp``),
    or takes its ``--resolve`` pin, and checks every address
    (:meth:`Rules.admit`);
 3. unless the name is pinned or the literal listed, refuses an address that
    is one of this host's own (:mod:`.local`), before connecting and again for
    the peer as connected;
 4. connects to exactly the address it checked, with socket buffers from the
    run's byte budget: nothing is resolved twice, so DNS rebinding between
    the check and the connection is impossible.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import start_thread
from .account import Account
from .local import LocalCheck
from .rules import Code, Decision, IPAddress, Rules, parse_host

__all__ = ["Opened", "Opener", "Refused", "Resolver", "system_resolver"]

Resolver = Callable[[str, int], Sequence[IPAddress]]
CONNECT_TIMEOUT_S = 30.0
RESOLVE_TIMEOUT_S = 15.0
MAX_LOOKUPS = 16  # name lookup threads per run at once, finished or given up on or not


def system_resolver(name: str, port: int) -> list[IPAddress]:
    """The host's resolver (``getaddrinfo``) for the absolute name ``name.``: TCP addresses,
    in its order.  The host's search domains never apply; nor does /etc/hosts, whose
    lookup in glibc does not match an absolute name (pin such names with --resolve)."""
    infos = socket.getaddrinfo(name.removesuffix(".") + ".", port, type=socket.SOCK_STREAM,
                               proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addr = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
            if addr not in found:
                found.append(addr)
    return found


class Refused(Exception):
    """A connection is refused: HTTP status, SOCKS reply, and the decision to log."""

    def __init__(self, decision: Decision, status: int = 403, socks_reply: int | None = None
                 ) -> None:
        super().__init__(decision.reason)
        self.decision = decision
        self.status = status
        self.socks_reply = socks_reply


def bad_request(reason: str, status: int = 400, socks_reply: int | None = None) -> Refused:
    return Refused(Decision(False, Code.BAD_REQUEST, reason), status, socks_reply)


class Opened(NamedTuple):
    decision: Decision
    upstream: socket.socket
    buffer: int | None  # the socket buffer size granted from the run's budget


class Opener:
    """Opens upstream connections for one run's rules; runs on the proxy's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rules: Rules, account: Account,
                 resolver: Resolver) -> None:
        self.loop = loop
        self.rules = rules
        self.account = account
        self.resolver = resolver
        self.lookups = asyncio.Semaphore(MAX_LOOKUPS)
        self.local = LocalCheck()

    async def open(self, host: str, port: int) -> Opened:
        """Decide, resolve, admit, connect; raises Refused."""
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
        explicit = self.rules.explicit(target)
        if not explicit:
            self._refuse_own(decision, str(decision.address))
        size = self.account.grant_buffer()
        try:
            upstream = await self._connect(decision, size)
            try:
                if not explicit:
                    self._refuse_own(decision, str(upstream.getpeername()[0]))
            except BaseException:
                upstream.close()
                raise
        except BaseException:
            self.account.release_buffer(size)
            raise
        return Opened(decision, upstream, size)

    def _refuse_own(self, decision: Decision, address: str) -> None:
        """Refuse ``address`` if it is one of this host's own (fail closed if unknown)."""
        addr = ipaddress.ip_address(address.partition("%")[0])
        try:
            own = self.local.is_local(addr)
        except OSError as e:
            raise Refused(decision.refuse(
                Code.BLOCKED_ADDRESS, f"cannot tell whether {addr} is one of this host's own "
                f"addresses ({e.strerror or e}); refused")) from None
        if own:
            raise Refused(decision.refuse(
                Code.BLOCKED_ADDRESS,
                f"{decision.host} resolves to {addr}, one of this host's own addresses; pin it "
                f"with --resolve {decision.host}:{addr} to reach it on purpose"))

    async def _resolve(self, decision: Decision, name: str, port: int) -> Sequence[IPAddress]:
        """The host resolver's answer for ``name``, in a thread; refused after
        ``RESOLVE_TIMEOUT_S``, waiting for a free lookup slot included.

        A slot is freed when its thread ends, not when the request gives up on it:
        a hung resolver then costs a run at most ``MAX_LOOKUPS`` threads.
        """
        future: asyncio.Future[Sequence[IPAddress]] = self.loop.create_future()
        loop, slots = self.loop, self.lookups

        def lookup() -> None:  # in a daemon thread: a hung resolver never blocks shutdown
            try:
                result: Any = self.resolver(name, port)
                ok = True
            except (OSError, UnicodeError, ValueError) as e:
                result, ok = e, False
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(_settle, future, ok, result)
                loop.call_soon_threadsafe(slots.release)

        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                await slots.acquire()
                try:
                    start_thread(lookup, "corral-resolve")
                except BaseException:
                    slots.release()
                    raise
                return await future
        except (OSError, TimeoutError, UnicodeError, ValueError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else (
                getattr(e, "strerror", None) or str(e) or type(e).__name__)
            raise Refused(decision.refuse(Code.UNRESOLVED,
                                          f"{name} could not be resolved: {why}"),
                          502) from None

    async def _connect(self, decision: Decision, size: int | None) -> socket.socket:
        assert decision.address is not None
        addr = ipaddress.ip_address(decision.address)
        family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if size is not None:  # before connecting, so the window is scaled for it
                upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
                upstream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
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

    def close(self) -> None:
        self.local.close()


def _settle(future: asyncio.Future[Sequence[IPAddress]], ok: bool, result: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(result)
    else:
        future.set_exception(result)
