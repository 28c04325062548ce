"""Canary servers on the host: whoever reaches one is recorded, nothing is answered.

TCP and UDP on 127.0.0.1 (and ``::1`` where the host has it), pathname unix
sockets (an ssh-agent-like one in the fake home, a daemon-like one beside
it, and a datagram one like ``/dev/log``) and an abstract unix socket, all
served by one thread.  A sandbox with a
network namespace of its own reaches none of the loopback or abstract ones;
a sandbox that hides the paths reaches no pathname socket.
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import start_thread

__all__ = ["SERVERS", "Listeners"]

SERVERS = ("tcp", "tcp6", "udp", "unix-agent", "unix-daemon", "unix-dgram", "abstract",
           "via-literal", "via-name", "via-numeric")
DATAGRAM = ("udp", "unix-dgram")
Address = tuple[str, int] | str


def bind(name: str, address: Address) -> socket.socket | None:
    """A listening (or, for UDP, bound) socket; None when the host lacks the address."""
    kind = socket.SOCK_DGRAM if name in DATAGRAM else socket.SOCK_STREAM
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, kind)
        sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o666)  # the fake home's owner may differ from the probe's user
    else:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, kind)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            return None  # no IPv6 loopback on this host
    if kind == socket.SOCK_DGRAM:
        return sock
    sock.listen(64)
    return sock


@dataclass
class Listeners:
    """The canary servers of one probe run, and what reached them."""

    sockets: dict[str, socket.socket] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, addresses: Mapping[str, Address]) -> dict[str, int]:
        """Bind every server and start serving; returns the loopback ports."""
        for name, address in addresses.items():
            sock = bind(name, address)
            if sock is not None:
                sock.setblocking(False)  # two threads may try the same accept(): one gets EAGAIN
                self.sockets[name] = sock
        self.wake_r, self.wake_w = socket.socketpair()
        self.thread = start_thread(self._serve, "corral-probe-canaries")
        return {name: s.getsockname()[1] for name, s in self.sockets.items()
                if s.family in (socket.AF_INET, socket.AF_INET6)}
    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            for name, sock in self.sockets.items():
                sel.register(sock, selectors.EVENT_READ, name)
            sel.register(self.wake_r, selectors.EVENT_READ, None)
            while True:
                for key, _ in sel.select():
                    if key.data is None:
                        return
                    self._record(key.data, key.fileobj)  # type: ignore[arg-type]

    def _record(self, name: str, sock: socket.socket) -> None:
        try:
            if sock.type == socket.SOCK_DGRAM:
                _, peer = sock.recvfrom(4096)
            else:
                conn, peer = sock.accept()
                conn.close()
        except OSError:
            return
        with self.lock:
            self.events.append((name, str(peer) or "a local peer"))

    def seen(self, name: str) -> list[str]:
        """Who reached ``name`` so far, counting a connection still waiting to be accepted
        (a client's connect() succeeds before the serving thread gets to it)."""
        sock = self.sockets.get(name)
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self._record(name, sock)
        with self.lock:
            return [peer for server, peer in self.events if server == name]

    def close(self) -> None:
        if hasattr(self, "thread"):
            self.wake_w.send(b"x")
            self.thread.join(5)
            self.wake_r.close()
            self.wake_w.close()
        for sock in self.sockets.values():
            sock.close()
