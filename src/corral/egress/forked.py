"""The proxy in a child process forked from corral's own CLI: its start-up on the other core.

Importing asyncio and the proxy costs 20-40 ms of CPU.  On a thread, under
the GIL, that import overlaps only the launcher's waits; in a child forked
just before bwrap is launched it runs beside the launcher on the second core.
The child is a copy of the session: the same rules, account, decision log
and the proxy's end of the pair, so nothing is sent to it, and it runs the
same :meth:`Session._serve`.  Only the CLI asks for this
(:func:`corral.egress.fork_proxies`), in its own single-threaded process: a
library caller's process may hold locks in other threads, or be large, so
:func:`corral.run` keeps the thread.

Agent mode forks it earlier still (:func:`fork_child` with ``early``, through
:func:`corral.egress.session.prefork`), before the run's directory and log
exist: the child imports the proxy at once, while the launcher resolves the
sandbox, then waits for the log's descriptor on a socket of its own
(:meth:`Child.hand_log`, SCM_RIGHTS); the launcher opens the log itself, so a
log that cannot be made still stops the run before it starts.  A run that
ends before that (a bad project, say) kills the child (:meth:`Child.abandon`).

The child answers to the parent through two pipes.  ``stop``: the parent
never writes it; its end of file (the parent's :meth:`Session.close`, or the
parent's death, even by SIGKILL) makes the proxy close every connection and
end.  ``result``: the child's last words, one JSON object (its failure, if
any, and the run's first denials); a child that ends without them (killed,
crashed) is a failed proxy, so the run ends in status ``error``, as with a
thread that failed.  Every other descriptor the child inherited is replaced
by /dev/null, so it keeps no file, lock or pipe of the parent's alive, and a
stale Python object closing "its" number later closes /dev/null, never one
of the child's sockets.
"""

from __future__ import annotations

import _socket  # not socket (~2.5 ms): a pair and one descriptor passed
import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .log import DecisionLog
    from .session import Session

__all__ = ["Child", "ProxyFailed", "fork_child"]

RESULT_CAP = 4 << 20  # the child's last words: 1,000 denials fit many times over
# The signals corral's CLI turns into a teardown; in the child they keep their default
# (SIGINT from the terminal reaches the whole group: the parent tears the run down).
_DEFAULT = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


class ProxyFailed(Exception):
    """A failure reported by (or about) the proxy's child process."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Child:
    """The parent's handle on the proxy's process."""

    def __init__(self, pid: int, stop_w: int, result_r: int,
                 ctl: _socket.socket | None = None) -> None:
        self.pid, self.stop_w, self.result_r = pid, stop_w, result_r
        self.ctl = ctl  # an early child's wait for its log, until hand_log

    def hand_log(self, log: DecisionLog) -> None:
        """An early child's log (its descriptor, or none without a record): from here on
        the child serves.  Raises OSError if the child cannot be told (it died)."""
        assert self.ctl is not None, "only an early child waits for its log"
        ctl, self.ctl = self.ctl, None
        try:
            fds = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, log.fd.to_bytes(4, sys.byteorder))
                   ] if log.fd >= 0 else []
            ctl.sendmsg([b"log"], fds)
        finally:
            ctl.close()

    def abandon(self) -> None:
        """The run ends before its proxy served: the child killed and reaped."""
        for fd in (self.stop_w, self.result_r):
            os.close(fd)
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        _reap(self.pid, True)

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Tell the child to stop, read its last words, reap it (killed if it takes longer
        than ``timeout_s``).  Never raises: a child that said nothing reports a failure."""
        if self.ctl is not None:  # never handed its log: it ends without serving
            self.ctl.close()
            self.ctl = None
        os.close(self.stop_w)
        data = _read_all(self.result_r, time.monotonic() + timeout_s)
        os.close(self.result_r)
        status = _reap(self.pid, data is None)
        try:
            result = json.loads(data or b"")
            if isinstance(result, dict) and status == 0:
                return result
        except ValueError:
            pass
        why = "did not stop in time" if data is None else f"ended with {_status(status)}"
        return {"failure": f"ProxyFailed: its process {why} and gave no result",
                "denials": []}


def fork_child(session: Session, early: bool = False) -> Child:
    """Fork the proxy's process for ``session`` (started: its pair and log exist; with
    ``early``, its pair alone, and the log comes by :meth:`Child.hand_log`).

    In the parent, returns the child's handle; the proxy's end of the pair and the
    log's descriptor are then the child's only.  Raises OSError if it cannot fork."""
    assert session.ours is not None and (early or session.log is not None)
    stop_r, stop_w = os.pipe()
    result_r, result_w = os.pipe()
    ctl: tuple[_socket.socket, _socket.socket] | None = None
    try:
        if early:
            ctl = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        pid = os.fork()
    except OSError:
        for fd in (stop_r, stop_w, result_r, result_w):
            os.close(fd)
        for end in ctl or ():
            end.close()
        raise
    if pid == 0:  # pragma: no cover - the child; its behaviour is tested end to end
        _child(session, stop_r, result_w, ctl[1] if ctl else None)
    os.close(stop_r)
    os.close(result_w)
    if ctl is not None:
        ctl[1].close()
    return Child(pid, stop_w, result_r, ctl[0] if ctl else None)


def _child(session: Session, stop_r: int, result_w: int,
           ctl: _socket.socket | None) -> NoReturn:
    code = 1
    try:
        assert session.ours is not None and (ctl is not None or session.log is not None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name in _DEFAULT:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        keep = {0, 1, 2, stop_r, result_w, session.ours.fileno()}
        # An early child's copy of the parent's end of ctl becomes /dev/null here, so the
        # parent closing its own is an end of file.
        keep.add(ctl.fileno() if ctl is not None else session.log.fd)  # type: ignore[union-attr]
        _blank_all_but(keep)
        # The proxy never speaks TLS; asyncio imports ssl only if it can (~4 ms).  This
        # process is the proxy's alone, so no one else's import of ssl is changed.
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
        failure: str | None = None
        try:
            if ctl is not None:
                session.log = _early_log(ctl)
            session.stop_fd = stop_r
            if session.log is not None:
                session._serve(session.ours, session.log)
        except BaseException as e:  # reported to the parent: never a silent death
            failure = _describe(e)
        log = session.log
        result = {"failure": failure, "denials": list(log.denials()) if log else []}
        _write_all(result_w, json.dumps(result).encode()[:RESULT_CAP])
        code = 0
    finally:
        os._exit(code)


def _early_log(ctl: _socket.socket) -> DecisionLog | None:
    """An early child: import the proxy now (what forking early is for), then wait for
    the log's descriptor; None if the parent closed the socket without one."""
    import asyncio  # noqa: F401

    from . import proxy  # noqa: F401
    from .log import DecisionLog

    msg, ancillary, _, _ = ctl.recvmsg(16, _socket.CMSG_SPACE(4))
    ctl.close()
    if msg != b"log":
        return None
    log = DecisionLog(None)
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
            log.fd = int.from_bytes(data[:4], sys.byteorder)
    return log


def _describe(e: BaseException) -> str:
    return e.what if isinstance(e, ProxyFailed) else f"{type(e).__name__}: {e}"


def _blank_all_but(keep: set[int]) -> None:
    """Every inherited descriptor not in ``keep`` becomes /dev/null (see the docstring)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != null:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.dup2(null, fd, inheritable=False)
    for fd in (0, 1, 2):  # the terminal or the caller's pipes: the child prints nothing
        os.dup2(null, fd)
    os.close(null)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd: int, deadline: float) -> bytes | None:
    """What the child writes until it closes the pipe; None if it is not done by then."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size <= RESULT_CAP:
            chunks.append(chunk)


def _reap(pid: int, kill: bool) -> int:
    """The child's wait status, killing it first if ``kill``."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped by someone else (a SIGCHLD handler)
            return 0


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
