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


class Bridge:
    """Listens on 127.0.0.1 inside the sandbox; passes each accepted socket to the proxy."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.ctrl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, int(spec["fd"]))
        self.listener = _socket.socket(_socket.AF_INET,
                                       _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC, 0)
        self.listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        self.listener.bind((spec.get("host", "127.0.0.1"), int(spec["port"])))
        self.listener.listen(BACKLOG)
        self.listener.setblocking(False)
        os.set_inheritable(self.ctrl.fileno(), False)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def forward(self) -> bool:
        """Accept one waiting connection and pass it on; False when none was waiting."""
        try:
            fd, _ = self.listener._accept()  # type: ignore[attr-defined]
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

    def serve(self, pid: int) -> int:
        """Forward connections until child ``pid`` ends; returns its wait status."""
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        try:
            while True:
                for fd, _ in poller.poll():
                    if fd == pidfd:
                        return os.waitpid(pid, 0)[1]
                    while self.forward():
                        pass
        finally:
            os.close(pidfd)
            self.close()

    def close(self) -> None:
        self.listener.close()
        self.ctrl.close()
