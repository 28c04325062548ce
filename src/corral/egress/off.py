"""No egress: what a run gets when its policy allows no name (no proxy, no bridge).

Kept apart from :mod:`.session` so that a run without network never imports
asyncio and the proxy.
"""

from __future__ import annotations

from ..bwrap import Sandbox

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NoEgress"]


class NoEgress:
    """The policy allows no name: no proxy, no bridge, nothing to close."""

    pass_fds: tuple[int, ...] = ()
    log_path: str | None = None
    error: str | None = None  # as Session.error: nothing can fail here

    def attach(self, sb: Sandbox) -> Sandbox:
        return sb

    def wait(self) -> None:
        pass

    def quiesce(self) -> None:
        pass

    def denials(self) -> tuple[dict[str, Any], ...]:
        return ()

    def close(self) -> None:
        pass

    def __enter__(self) -> NoEgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
