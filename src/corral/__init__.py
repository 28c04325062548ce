"""corral: sandbox AI coding agents, and the scripts they write, with bubblewrap.

    >>> import corral
    >>> result = corral.run(["/bin/true"])
    >>> result.exit_code
    0

Public names are imported lazily, so ``import corral`` costs almost nothing.
"""

from __future__ import annotations

__all__ = [
    "Allow",
    "CorralError",
    "HostError",
    "LaunchError",
    "Limits",
    "Network",
    "Policy",
    "ProfileError",
    "Result",
    "RunRequest",
    "RunResult",
    "UsageError",
    "load_profile",
    "run",
]
__version__ = "0.1.0"

_WHERE = {
    "Allow": "policy", "Limits": "policy", "Network": "policy", "Policy": "policy",
    "CorralError": "errors", "HostError": "errors", "LaunchError": "errors",
    "ProfileError": "errors", "UsageError": "errors",
    "Result": "api", "run": "api", "load_profile": "profiles",
    "RunRequest": "request", "RunResult": "result",
}

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

    from .api import Result, run
    from .errors import CorralError, HostError, LaunchError, ProfileError, UsageError
    from .policy import Allow, Limits, Network, Policy
    from .profiles import load_profile
    from .request import RunRequest
    from .result import RunResult


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    # __import__ with a fromlist gives the submodule itself; importlib (with warnings) is
    # not imported for it at every command line's end.
    return getattr(__import__(f"{__name__}.{_WHERE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
