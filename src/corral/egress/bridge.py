"""corral's in-sandbox egress bridge: standard library only, run by corral's init.

This file is handed into the sandbox on its own (``--ro-bind-data``) and
executed by the init's parent process, which lives for the whole run.  It
must import almost nothing: it runs on every launch with egress
(``_socket`` and ``select`` cost well under a millisecond; ``socket.py``
alone costs about 10 ms, ``asyncio`` about 15 ms).

How it works: before the init forks the payload, :class:`Bridge` binds and
listens on ``127.0.0.1:PORT`` inside the sandbox's network namespace, so a
client's first connection is queued even before the bridge loop runs (no
first-request race).  For each connection it accepts, it sends the accepted
socket itself to corral's host-side proxy over a unix socket pair that the
launcher handed in (``SCM_RIGHTS``), then closes its own copy.  The bridge
never reads a byte of the payload's traffic: the proxy reads the request,
decides, connects and relays, so the data crosses one user-space relay only.

The bridge also listens on each relayed loopback address and port
(``spec["relays"]``, from rules such as ``--allow-domain 127.0.0.1:11434``),
so a client that ignores proxy variables and connects straight to
``127.0.0.1:11434`` reaches the host's service there.  The proxy tells which
listener accepted a socket from the socket's own address (``getsockname``),
which the payload cannot forge.

Why this direction of descriptor passing is safe: only sockets *from* the
sandbox go to the host, never a host socket into the sandbox (a host TCP
socket can be disconnected with ``connect(AF_UNSPEC)`` and reconnected
anywhere from the host's network namespace).  The proxy checks that every
descriptor it receives is a TCP socket and trusts none of its bytes.  The
socket pair has no path, so no other process can reach the proxy at all;
the payload never holds it (the init's child closes every descriptor but
0-2 before exec, and the init is not dumpable, so it cannot be taken with
``pidfd_getfd`` or ptrace).
"""

from __future__ import annotations

import _socket
import os
import select
import sys

TYPE_CHECKING = False  # no typing import at run time: this file starts with every launch
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Bridge"]

BACKLOG = 4096
MESSAGE = b"c"  # one byte per passed socket; the descriptor is the message


def _listen(host: str, port: int) -> Any:
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    sock = _socket.socket(family, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC, 0)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


class Bridge:
    """Listens on 127.0.0.1 inside the sandbox; passes each accepted socket to the proxy."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.ctrl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, int(spec["fd"]))
        os.set_inheritable(self.ctrl.fileno(), False)
        self.listeners: list[Any] = []
        try:
            self.listeners.append(_listen(spec.get("host", "127.0.0.1"), int(spec["port"])))
            for host, port in spec.get("relays", ()):
                self.listeners.append(_listen(str(host), int(port)))
        except OSError:
            self.close()
            raise
        self.listener = self.listeners[0]
        self.batch = int(spec.get("batch", 64))  # connections per wake-up (session.Bridge)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def forward(self, listener: Any = None) -> bool:
        """Accept one connection waiting on ``listener`` (default: the proxy port) and pass
        it on; False when none was waiting."""
        try:
            fd, _ = (listener or self.listener)._accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return False
        except OSError:
            return False  # EMFILE and the like: the client sees its connection reset
        try:
            rights = fd.to_bytes(4, sys.byteorder)
            self.ctrl.sendmsg([MESSAGE], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        except OSError:
            pass  # the proxy is gone (the run is ending): the client sees a reset
        finally:
            os.close(fd)
        return True

    def serve(self, pid: int, launcher: int | None = None) -> int | None:
        """Forward connections until child ``pid`` ends; returns its wait status.

        ``launcher`` is a pidfd of the launcher's process, readable once it is gone: then
        None, and the caller ends the sandbox (inner.py's ``supervise`` says why)."""
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        by_fd = {sock.fileno(): sock for sock in self.listeners}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        if launcher is not None:
            poller.register(launcher, select.POLLIN)
        try:
            while True:
                ready = [fd for fd, _ in poller.poll()]
                if launcher in ready:
                    return None
                if pidfd in ready:
                    return os.waitpid(pid, 0)[1]
                # At most self.batch connections, then poll again: a payload that keeps
                # the accept queue full must not keep the watches above from running.
                for fd in ready:
                    for _ in range(self.batch):
                        if not self.forward(by_fd[fd]):
                            break
        finally:
            os.close(pidfd)
            self.close()

    def close(self) -> None:
        for sock in self.listeners:
            sock.close()
        self.ctrl.close()
