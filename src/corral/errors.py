"""The exceptions corral raises, in one small tree.

    CorralError            anything corral refuses or fails to do; nothing ran
     ├── UsageError        bad input: a flag, an argument, a path, a size
     │    └── ProfileError a profile that is malformed or has unknown keys
     ├── HostError         this host cannot enforce a protection the policy asks for
     └── LaunchError       the sandbox could not be set up at launch
    Interrupted            (a BaseException, like KeyboardInterrupt) SIGTERM or SIGHUP
                           reached the CLI: the run is unwound, audited, and ends

Every message has one shape, ``WHAT; WHY; HOW TO FIX``, on one line, so the
CLI can print ``corral: error: <message>`` and exit 125.  The library never
prints or exits; the CLI maps this whole tree to exit status 125 in one place.
"""

from __future__ import annotations

import os

from . import sig as signal
from . import small

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable
    from re import Pattern
    from threading import Thread

__all__ = ["CorralError", "HostError", "Interrupted", "LaunchError", "ProfileError",
           "UsageError", "pattern", "standard_streams", "start_thread"]


class CorralError(Exception):
    """Base class: corral could not do what was asked, and started nothing."""

    def __init__(self, what: str, why: str = "", fix: str = "") -> None:
        parts = [p.strip().replace("\n", " ") for p in (what, why, fix) if p.strip()]
        super().__init__("; ".join(parts))
        self.notes: tuple[str, ...] = ()  # what the audit did before this reached the caller


class UsageError(CorralError):
    """The caller gave corral something it cannot use."""


class ProfileError(UsageError):
    """A profile (TOML) is malformed, has unknown keys, or names a missing profile."""


class HostError(CorralError):
    """This host lacks what a requested protection needs, and no relaxation was named."""


class LaunchError(CorralError):
    """bwrap or corral's in-sandbox init failed before the command started."""


# Signals whose default ends the process.  The CLI turns SIGINT into KeyboardInterrupt and
# the others into Interrupted; what must not be cut short (the audit, the copy-out of a
# workspace image) holds every one of them (corral.audit.signals_held).
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGALRM)

# Faults the kernel sends to the very thread that caused them: never blocked (a blocked
# one would only be held, or kill the process outright).
_SYNCHRONOUS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
                signal.SIGSYS, signal.SIGPIPE, signal.SIGXFSZ}


def standard_streams() -> None:
    """Descriptors 0, 1 and 2 open (on /dev/null where closed), before corral opens any of
    its own: with 2 closed, a lock folder's descriptor took its number, and the launch,
    handing the payload "corral's stderr", gave it a handle on a host folder (review 11)."""
    import sys

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd``
            os.set_inheritable(null, True)
    for name in ("stdin", "stdout", "stderr"):  # Python leaves None for a closed one
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w"))  # noqa: SIM115


def children_seen() -> None:
    """Refuse to start in a process that ignores SIGCHLD: the kernel then reaps every
    child unseen, so the exit status of corral's own helpers (mke2fs, git) reads as
    success whatever happened, and the run waited on bwrap forever.  The command line
    puts the default back; a library caller's process is its own to change."""
    from . import sig

    if sig.getsignal(sig.SIGCHLD) == sig.SIG_IGN or _kernel_ignores(sig.SIGCHLD):
        raise UsageError("this process ignores SIGCHLD", "its children are reaped unseen: "
                         "corral could not tell a failed step from a passed one",
                         "signal.signal(signal.SIGCHLD, signal.SIG_DFL) before corral runs")
    if _no_child_wait():
        raise UsageError("this process sets SA_NOCLDWAIT on SIGCHLD", "its children are "
                         "reaped unseen: corral could not tell a failed step from a passed "
                         "one", "signal.signal(signal.SIGCHLD, signal.SIG_DFL) before "
                         "corral runs")


def _no_child_wait() -> bool:
    """Whether SIGCHLD's action has SA_NOCLDWAIT, which reaps children unseen as an ignored
    SIGCHLD does but shows in neither ``signal.getsignal`` nor ``SigIgn``: read by the raw
    ``rt_sigaction`` (x86_64 and aarch64; elsewhere not seen)."""
    import ctypes  # loaded by every run anyway (corral.beneath)

    nr = signal.RT_SIGACTION.get(os.uname().machine)
    if nr is None:
        return False
    action = (ctypes.c_ulong * 4)()  # handler, flags, restorer, mask: flags second on both
    if ctypes.CDLL(None, use_errno=True).syscall(nr, signal.SIGCHLD, None, action, 8) != 0:
        return False
    return bool(action[1] & signal.SA_NOCLDWAIT)


def _kernel_ignores(signum: int) -> bool:
    """Whether the kernel has ``signum`` ignored in this process: a disposition set
    behind Python's back (ctypes, a C library) is not in ``signal.getsignal`` (review
    12)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


@small.cache
def pattern(text: str) -> Pattern[str]:
    """``re.compile(text)``, made at its first use: importing re (with enum) and compiling
    at import time cost every ``corral run`` a few ms for patterns most runs never use."""
    import re

    return re.compile(text)


def start_thread(target: Callable[..., object], name: str, *args: object) -> Thread:
    """Start a daemon thread of corral's own that takes no signal sent to corral.

    Every signal is the main thread's: Python runs a handler only there, and only once
    that thread wakes, so a signal the kernel gave another thread (it may pick any that
    does not block it) waited until the main thread's next wake-up: a terminal resize
    reached the payload only when the run printed something (seen in CI), and a stop
    could land where the audit holds it.  The mask is set before the thread exists (it
    inherits it), so there is no moment in which it takes one."""
    import threading

    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return thread


class Interrupted(BaseException):
    """A signal asked corral to stop (the CLI raises it from SIGTERM and SIGHUP), so that
    everything unwinds in order: the sandbox killed, the run audited, the record written.
    A BaseException like KeyboardInterrupt: ``except Exception`` does not swallow it."""

    def __init__(self, signum: int, notes: tuple[str, ...] = ()) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum
        self.notes = notes  # what the audit did while the run unwound
