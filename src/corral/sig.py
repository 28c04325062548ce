"""The signal numbers and calls of corral's launch path, from ``_signal``: the C module the
signal module wraps, turning its numbers and results into enums.  Importing signal
imports enum and builds four enum classes, about 6% of the CPU of a ``corral run --
/bin/true`` (bench/RESULTS.md, "The launch floor"); the values here are the same numbers,
as plain ints.  A module that needs the enums imports signal itself."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # the types of the signal module's own (its stubs: _signal has none)
    from signal import (
        SIG_BLOCK,
        SIG_DFL,
        SIG_IGN,
        SIG_SETMASK,
        SIGALRM,
        SIGBUS,
        SIGCHLD,
        SIGCONT,
        SIGFPE,
        SIGHUP,
        SIGILL,
        SIGINT,
        SIGKILL,
        SIGPIPE,
        SIGQUIT,
        SIGSEGV,
        SIGSTOP,
        SIGSYS,
        SIGTERM,
        SIGTRAP,
        SIGUSR1,
        SIGUSR2,
        SIGWINCH,
        SIGXFSZ,
        getsignal,
        pidfd_send_signal,
        pthread_sigmask,
        signal,
        valid_signals,
    )
else:
    try:
        import _signal as _module
    except ImportError:  # another Python
        import signal as _module

__all__ = [
    "SIGALRM", "SIGBUS", "SIGCHLD", "SIGCONT", "SIGFPE", "SIGHUP", "SIGILL", "SIGINT", "SIGKILL",
    "SIGPIPE", "SIGQUIT", "SIGSEGV", "SIGSTOP", "SIGSYS", "SIGTERM", "SIGTRAP", "SIGUSR1",
    "SIGUSR2", "SIGWINCH", "SIGXFSZ", "SIG_BLOCK", "SIG_DFL", "SIG_IGN", "SIG_SETMASK",
    "getsignal", "pidfd_send_signal", "pthread_sigmask", "signal", "valid_signals"]

if not TYPE_CHECKING:
    globals().update({name: getattr(_module, name) for name in __all__})

# The raw rt_sigaction(2), by machine, for what the libc or the signal module will not do
# (the libc's reserved 32 and 33, and reading an action's flags).
RT_SIGACTION = {"x86_64": 13, "aarch64": 134}
SA_NOCLDWAIT = 2  # asm-generic and x86
