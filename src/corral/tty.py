"""The user's terminal stays the user's: an interactive run gets a pseudo-terminal corral owns.

A payload holding the user's real terminal can do to it what the terminal allows: change
its line discipline (``TIOCSETD``: dead after corral exits), read what the user types to
their shell once corral is suspended, leave it in raw mode.  So when any of corral's
standard descriptors is a terminal (and output is not captured), :class:`Terminal` opens
a fresh pty: its slave replaces each terminal descriptor of the sandbox (pipes and files
pass through as they are), and corral relays between the master and the user's terminal.
The sandbox's init makes the slave its controlling terminal and puts the payload in the
foreground, so ``^C`` and resizes reach the payload through the pty as they would on a
terminal of its own.  What the sandbox prints reaches the user's terminal without the
escape sequences that set or read the clipboard (corral.termout).

The user's terminal is put in raw mode while the run lives and restored on every way
out (the launcher closes :class:`Terminal` in a ``finally``; SIGTERM and SIGHUP restore
it before the default action).  The suspend character (``^Z``) is corral's: it freezes
the whole sandbox (:class:`Freezer`), gives the terminal back and stops corral; ``fg``
thaws it.  Non-interactive runs keep plain pipes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import termios
import time
from collections.abc import Callable

from . import sig as signal
from . import termout
from .errors import LaunchError

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Freezer", "Terminal"]

CHUNK = 1 << 16
FREEZE_WAIT_S = 5.0
RESTORE_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raw(mode: list[Any]) -> list[Any]:
    """``mode`` with what cfmakeraw(3) clears cleared: no echo, no line editing, no
    signals from keys, no output processing; reads return each byte."""
    new = list(mode)
    iflag, oflag, cflag, lflag = (int(new[i]) for i in range(4))
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
               | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    cc = list(new[6])
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    new[0:4], new[6] = [iflag, oflag, cflag, lflag], cc
    return new


class Terminal:
    """A pty between the sandbox and the user's terminal; see the module docstring.

    :meth:`attach` before the launch (None when no standard descriptor is a terminal),
    :meth:`started` once bwrap runs, :meth:`ready` when a descriptor of :meth:`fds` is
    readable, :meth:`close` always.
    """

    def __init__(self, ttys: tuple[bool, bool, bool]) -> None:
        self.ttys = ttys
        self.user = next(fd for fd in (0, 1, 2) if ttys[fd])  # a descriptor on the terminal
        self.out = 1 if ttys[1] else 2 if ttys[2] else None  # where the pty's output goes
        self.saved: list[Any] = termios.tcgetattr(self.user)
        self.master, self.slave = os.openpty()
        os.set_inheritable(self.slave, False)
        termios.tcsetattr(self.slave, termios.TCSANOW, self.saved)
        self.resize()
        self.pending = b""  # typed, not yet taken by the pty
        self.output = termout.Output()  # the clipboard's escape sequences taken out
        self.raw = False
        self.freezer: Freezer | None = None
        self.old_handlers: dict[int, object] = {}
        self.suspend_char = bytes([self.saved[6][termios.VSUSP][0]]) \
            if isinstance(self.saved[6][termios.VSUSP], bytes) else b"\x1a"

    @classmethod
    def attach(cls, stdin: bool = True) -> Terminal | None:
        """A pty for the launch when corral's descriptors 0 (if ``stdin``: it is not
        replaced by a pipe), 1 or 2 are a terminal; else None."""
        ttys = (stdin and os.isatty(0), os.isatty(1), os.isatty(2))
        if not any(ttys):
            return None
        try:
            return cls(ttys)
        except (OSError, termios.error) as e:  # no /dev/ptmx, or kernel.pty.max reached
            raise LaunchError("cannot open a pseudo-terminal for the run", str(e),
                              "check /dev/ptmx and kernel.pty.max, or run it without a "
                              "terminal (redirect its input and output)") from None

    def child_fd(self, fd: int) -> int | None:
        """What the sandbox gets as descriptor ``fd``: the pty, or None (inherit corral's)."""
        return self.slave if self.ttys[fd] else None

    def sandbox_fd(self, stderr_fd: int) -> int:
        """The init's descriptor for the pty, which it makes its controlling terminal:
        0 or 1, or the one it later moves to 2 (``stderr_fd``)."""
        return 0 if self.ttys[0] else 1 if self.ttys[1] else stderr_fd

    def started(self, freezer: Freezer) -> None:
        """bwrap holds the slave now: drop ours (so the master sees the end), go raw."""
        os.close(self.slave)
        self.slave = -1
        self.freezer = freezer
        for sig in (*RESTORE_SIGNALS, signal.SIGWINCH, signal.SIGCONT):
            with contextlib.suppress(ValueError):  # not the main thread
                self.old_handlers[sig] = signal.signal(sig, self._on_signal)
        self._enter()

    def fds(self) -> list[int]:
        """The pty's output, and the user's keys (unless corral started in the background,
        where reading them would stop it: ``corral ... &``)."""
        return [self.master, *([0] if self.ttys[0] and not self._in_background() else [])]

    def ready(self, fd: int) -> bool:
        """Relay what ``fd`` has; False once the master has reached its end."""
        if fd == self.master:
            try:
                data = os.read(self.master, CHUNK)
            except OSError as e:  # EIO: every holder of the slave is gone
                if e.errno not in (errno.EIO, errno.EAGAIN):
                    raise
                return e.errno == errno.EAGAIN
            if not data:
                return False
            if self.out is not None:
                _write_all(self.out, self.output.feed(data))
            return True
        data = os.read(0, CHUNK)
        if self.suspend_char in data:
            before, _, after = data.partition(self.suspend_char)
            self._send(before)
            self.suspend()
            data = after
        self._send(data)
        return True

    def _send(self, data: bytes) -> None:
        if data:
            with contextlib.suppress(OSError):  # the sandbox is gone
                _write_all(self.master, data)

    def resize(self) -> None:
        """The user's window size onto the pty (the kernel signals its foreground group)."""
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(self.user, termios.TIOCGWINSZ, b"\0" * 8)
            if struct.unpack("HHHH", size)[:2] != (0, 0):
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)

    def suspend(self) -> None:
        """^Z: freeze the whole run, give the terminal back, stop; on ``fg``, carry on."""
        if self.freezer is not None:
            self.freezer.freeze()
        self._leave()
        os.kill(os.getpid(), signal.SIGSTOP)
        # Continued.  In the background (bg), the run waits frozen until brought back.
        while self._in_background():
            os.kill(os.getpid(), signal.SIGSTOP)
        self._enter()
        self.resize()
        if self.freezer is not None:
            self.freezer.thaw()

    def _in_background(self) -> bool:
        try:
            return os.tcgetpgrp(self.user) != os.getpgrp()
        except OSError:
            return False

    def _enter(self) -> None:
        if self.ttys[0] and not self._in_background():
            with contextlib.suppress(termios.error):
                termios.tcsetattr(0, termios.TCSADRAIN, _raw(self.saved))
                self.raw = True

    def _leave(self) -> None:
        if self.raw:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(0, termios.TCSADRAIN, self.saved)
            self.raw = False

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGWINCH:
            self.resize()
        elif signum == signal.SIGCONT:
            self._enter()  # continued by someone else than our own suspend
        else:  # SIGTERM, SIGHUP: the terminal back first, then the signal's own end
            self.close()
            if not callable(signal.getsignal(signum)):  # else corral's (the CLI's) ends it
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def close(self) -> None:
        """Restore the user's terminal and corral's signal handlers; close the pty."""
        self._leave()
        if self.freezer is not None:
            self.freezer.close()  # a frozen run could never be killed and reaped
        for sig, handler in self.old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)  # type: ignore[arg-type]
        self.old_handlers.clear()
        for fd in (self.master, self.slave):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.master = self.slave = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            time.sleep(0.001)


class Freezer:
    """Stops every process of a sandbox and starts them again.

    With the run's cgroup v2 directory: its ``cgroup.freeze``.  Started by root on a host
    with the cgroup v1 freezer (``v1_dir``: a cgroup to make there for this run): every
    process of the sandbox's PID namespace is moved into it, pass after pass until none
    is left outside (a child forked inside stays inside), and the cgroup is FROZEN at
    once.  Otherwise (a plain user, who has no freezer of their own) every process of the
    namespace gets SIGSTOP, pass after pass until none still runs (a stopped process
    cannot fork), and SIGCONT on :meth:`thaw`.
    """

    def __init__(self, pid1: Callable[[], int | None], v2_dir: str | None = None,
                 v1_dir: str | None = None) -> None:
        self.pid1 = pid1
        self.v2_dir = v2_dir
        self.v1_dir = v1_dir
        self.v1_made = False
        self.stopped: list[int] = []
        self.frozen = False

    def freeze(self) -> None:
        self.frozen = True
        if self.v2_dir is not None and _write(self.v2_dir, "cgroup.freeze", "1"):
            return
        pid1 = self.pid1()
        if pid1 is None or (self.v1_dir is not None and self._v1_freeze(pid1)):
            return
        deadline = time.monotonic() + FREEZE_WAIT_S
        while time.monotonic() < deadline:
            running = [p for p in members(pid1) if _state(p) not in ("T", "t", "Z", "X")]
            if not running:
                break
            for pid in running:
                _signal(pid, signal.SIGSTOP)
                if pid not in self.stopped:
                    self.stopped.append(pid)
            time.sleep(0.005)

    def _v1_freeze(self, pid1: int) -> bool:
        assert self.v1_dir is not None
        try:
            os.makedirs(self.v1_dir, 0o755, exist_ok=True)
        except OSError:
            return False
        self.v1_made = True
        deadline = time.monotonic() + FREEZE_WAIT_S
        while time.monotonic() < deadline:
            inside = set(_pids(self.v1_dir))
            outside = [p for p in members(pid1) if p not in inside]
            if not outside:
                break
            for pid in outside:
                _write(self.v1_dir, "cgroup.procs", str(pid))  # gone meanwhile: ESRCH
        if not _write(self.v1_dir, "freezer.state", "FROZEN"):
            return False
        while time.monotonic() < deadline and _read(self.v1_dir, "freezer.state") != "FROZEN":
            time.sleep(0.005)
        return True

    def thaw(self) -> None:
        if not self.frozen:
            return
        if self.v2_dir is not None:
            _write(self.v2_dir, "cgroup.freeze", "0")
        if self.v1_made and self.v1_dir is not None:
            _write(self.v1_dir, "freezer.state", "THAWED")
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        self.frozen = False

    def close(self) -> None:
        """Thaw, and remove the v1 cgroup once the run's processes are gone."""
        self.thaw()
        if not self.v1_made or self.v1_dir is None:
            return
        deadline = time.monotonic() + FREEZE_WAIT_S
        while time.monotonic() < deadline:
            try:
                os.rmdir(self.v1_dir)
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while the last processes exit
                time.sleep(0.01)


def _write(cgroup: str, name: str, value: str) -> bool:
    try:
        fd = os.open(os.path.join(cgroup, name), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, value.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _read(cgroup: str, name: str) -> str:
    try:
        with open(os.path.join(cgroup, name)) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pids(cgroup: str) -> list[int]:
    return [int(p) for p in _read(cgroup, "cgroup.procs").split() if p.isdigit()]


def members(pid1: int) -> list[int]:
    """The processes in ``pid1``'s PID namespace (``pid1`` included)."""
    try:
        ns = os.readlink(f"/proc/{pid1}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    found.append(int(entry))
    return found


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return "X"


def _signal(pid: int, sig: int) -> None:
    """Signal ``pid`` through a pidfd, so a pid reused meanwhile is not hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)
