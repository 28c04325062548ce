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

import signal

__all__ = ["CorralError", "HostError", "Interrupted", "LaunchError", "ProfileError",
           "UsageError"]


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
# workspace image) holds every one of them (corral.audit.signals_held), and corral's own
# threads block them all, so that none is delivered where the main thread holds it.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGALRM)


def block_stopping() -> None:
    """In a thread of corral's own: leave the stopping signals to the main thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)


class Interrupted(BaseException):
    """A signal asked corral to stop (the CLI raises it from SIGTERM and SIGHUP), so that
    everything unwinds in order: the sandbox killed, the run audited, the record written.
    A BaseException like KeyboardInterrupt: ``except Exception`` does not swallow it."""

    def __init__(self, signum: int, notes: tuple[str, ...] = ()) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum
        self.notes = notes  # what the audit did while the run unwound
