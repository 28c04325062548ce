"""Engines: run :class:`~corral.request.RunRequest`\\ s and yield their results as they finish.

Front ends (``corral batch``, ``corral serve``) turn their input into requests and hand them
to an engine; an engine calls the one launcher (:func:`corral.execute.run_request`) on some
machine and knows nothing of the front end.  Two engines:

* :class:`~corral.engines.local.LocalPool`: a pool of worker threads on this machine;
* :class:`~corral.engines.ray.RayEngine`: Ray tasks on a cluster (``corral[ray]``), each
  running the request with corral on whichever node Ray picks.

Both take requests lazily and keep a bounded number in flight, so a batch of any length
holds only a few requests and results in memory at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from ..request import RunRequest
from ..result import RunResult

__all__ = ["Engine", "engine_for"]


class Engine(Protocol):
    """Runs requests; ``map`` yields one result per request, in the order they finish."""

    name: str
    workers: int

    def map(self, requests: Iterable[RunRequest]) -> Iterator[RunResult]: ...


def engine_for(name: str, *, workers: int | None = None, address: str | None = None,
               runs_dir: str | None = None, keep: bool = False,
               retries: int | None = None) -> Engine:
    """The engine called ``name`` (``local`` or ``ray``); UsageError when it cannot be had."""
    from ..errors import UsageError

    if name == "local":
        if address is not None or retries is not None:
            raise UsageError("--address and --retries are for --engine ray",
                             "the local engine runs here", "drop them, or add --engine ray")
        from .local import LocalPool

        return LocalPool(workers, runs_dir=runs_dir, keep=keep)
    if name == "ray":
        from .ray import RayEngine

        return RayEngine(address, workers=workers, runs_dir=runs_dir, keep=keep,
                         retries=retries)
    raise UsageError(f"engine {name!r} is not known", "engines: local, ray", "pick one of those")
