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

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
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

    def __init__(self, pid: int, stop_w: int, result_r: int) -> None:
        self.pid, self.stop_w, self.result_r = pid, stop_w, result_r

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Tell the child to stop, read its last words, reap it (killed if it takes longer
        than ``timeout_s``).  Never raises: a child that said nothing reports a failure."""
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


def fork_child(session: Session) -> Child:
    """Fork the proxy's process for ``session`` (started: its pair and log exist).

    In the parent, returns the child's handle; the proxy's end of the pair and the
    log's descriptor are then the child's only.  Raises OSError if it cannot fork."""
    assert session.ours is not None and session.log is not None
    stop_r, stop_w = os.pipe()
    result_r, result_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (stop_r, stop_w, result_r, result_w):
            os.close(fd)
        raise
    if pid == 0:  # pragma: no cover - the child; its behaviour is tested end to end
        _child(session, stop_r, result_w)
    os.close(stop_r)
    os.close(result_w)
    return Child(pid, stop_w, result_r)


def _child(session: Session, stop_r: int, result_w: int) -> NoReturn:
    code = 1
    try:
        assert session.ours is not None and session.log is not None
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name in _DEFAULT:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        _blank_all_but({0, 1, 2, stop_r, result_w, session.ours.fileno(), session.log.fd})
        # The proxy never speaks TLS; asyncio imports ssl only if it can (~4 ms).  This
        # process is the proxy's alone, so no one else's import of ssl is changed.
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
        failure: str | None = None
        try:
            session.stop_fd = stop_r
            session._serve(session.ours, session.log)
        except BaseException as e:  # reported to the parent: never a silent death
            failure = _describe(e)
        result = {"failure": failure, "denials": list(session.log.denials())}
        _write_all(result_w, json.dumps(result).encode()[:RESULT_CAP])
        code = 0
    finally:
        os._exit(code)


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
