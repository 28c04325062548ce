"""The HTTP/1.1 protocol corral's servers run on (``corral serve``, ``corral mcp --transport
http``): uvicorn's h11 protocol, with what it lacks against clients that are slow on purpose.

uvicorn waits for a request head as long as the client takes: 540 connections that had each
sent half a head made every later request a 503 (``limit_concurrency`` counts them), and
without that limit 1,100 of them used up a server's 1,024 descriptors.  So here:

* a request must arrive whole: its head within ``head_s`` of the connection (or of the
  previous response on it), its body within ``body_s`` after that; otherwise the connection
  is closed;
* at most ``max_waiting`` connections wait for their request at once: a new connection closes
  the one that has waited longest.  A client that sends its request at once never waits, so
  idle connections cannot crowd it out, however many there are;
* a response the client does not read: when the connection's write buffer stays full for
  ``send_s``, the connection is aborted, and what it held is freed.

uvicorn is imported when :func:`protocol` is called, not before (it is an optional extra).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["BODY_S", "HEAD_S", "MAX_WAITING", "SEND_S", "protocol"]

HEAD_S = 10.0  # a request head, from the connection (or the previous response)
BODY_S = 60.0  # its body, once the head is in: 32 MiB at half a MiB a second
SEND_S = 60.0  # a response the client stopped reading
MAX_WAITING = 256  # connections whose request has not arrived whole, at once


def protocol(head_s: float = HEAD_S, body_s: float = BODY_S, send_s: float = SEND_S,
             max_waiting: int = MAX_WAITING) -> type[Any]:
    """uvicorn's ``http=`` protocol class with these bounds (see the module docstring)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):  # type: ignore[misc, unused-ignore]
        phase: str | None = None  # "head" or "body" while the request is not in whole
        since = 0.0  # when that wait began (monotonic): the longest waiter goes first
        timer: Any = None  # closes the connection when its request is late
        stall: Any = None  # aborts it when its response is not read
        counted: Any = None  # the request cycle already seen

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait("head", head_s)
            others: list[Any] = list(self.connections)
            waiting = [c for c in others if getattr(c, "phase", None) is not None]
            if len(waiting) > max_waiting:
                oldest = min(waiting, key=lambda c: c.since)
                oldest.phase = None
                oldest.transport.close()

        def _wait(self, phase: str, seconds: float) -> None:
            self._cancel("timer")
            if self.phase is None:
                self.since = time.monotonic()
            self.phase = phase
            self.timer = self.loop.call_later(seconds, self._late)

        def _cancel(self, name: str) -> None:
            handle = getattr(self, name)
            if handle is not None:
                handle.cancel()
                setattr(self, name, None)

        def _late(self) -> None:
            self.timer = None
            if self.phase is not None:
                self.phase = None
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.phase is None or self.transport.is_closing():
                return
            if self.phase == "head":
                if self.cycle is None or self.cycle is self.counted:
                    return  # no new head yet
                self.counted = self.cycle
                if self.conn.their_state is h11.SEND_BODY:
                    self._wait("body", body_s)
                    return
            elif self.conn.their_state is h11.SEND_BODY:
                return  # the rest of the body is still to come
            self.phase = None
            self._cancel("timer")

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._wait("head", head_s)  # the next request on this connection, if any
            super().on_response_complete()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.stall is None:
                self.stall = self.loop.call_later(send_s, self.transport.abort)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel("stall")

        def connection_lost(self, exc: Exception | None) -> None:
            self.phase = None
            self._cancel("timer")
            self._cancel("stall")
            super().connection_lost(exc)

    return Guarded
