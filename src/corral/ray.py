"""corral on a Ray cluster: each RunRequest a Ray task (``corral[ray]``).

Every node runs corral itself; the request and the result travel as their JSON form
(:mod:`corral.request`); Ray does all the scheduling, the retries and the data movement::

    import ray
    import corral.ray
    from corral import RunRequest

    ray.init(address="auto")                      # or any cluster, or a local one
    requests = [RunRequest(code=f"print({i} * {i})", language="python", id=str(i))
                for i in range(1000)]
    for result in corral.ray.map(requests):       # RunResults, as they finish
        print(result.id, result.run.stdout if result.run else result.error)

    ref = corral.ray.submit(requests[0])          # one task: an ObjectRef
    result = corral.ray.result(ref)               # its RunResult

Each task asks Ray for one CPU (``num_cpus``), so a node runs as many requests at once as it
has CPUs.  A task whose worker or node dies is retried by Ray on another node (``max_retries``,
default 3): a job lost with its node finishes once, elsewhere.  (A job whose node died after it
had finished, but before its result reached the caller, can be run again by Ray to rebuild the
result; ``corral batch`` still writes its result once.)  A task that exhausts its retries comes
back as a result with status ``error``, not an exception.

Nothing is imported from Ray until one of these functions is called.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .record import replace
from .request import RunRequest
from .result import RunResult

__all__ = ["map", "result", "run_task", "submit"]

MAX_RETRIES = 3


def run_task(request_json: dict[str, Any], runs_dir: str | None, keep: bool) -> dict[str, Any]:
    """The body of the Ray task: run one request here with corral, say which node it was."""
    import ray

    from .engines.local import run_safely

    try:
        request = RunRequest.from_json(request_json)
    except Exception as e:  # a result, not an exception, goes back
        return RunResult.refused(request_json.get("id"), "invalid", str(e)).to_json()
    got = run_safely(request, runs_dir, keep)
    return replace(got, node=ray.get_runtime_context().get_node_id()).to_json()


_REMOTE: list[Any] = []  # the remote function, made on first use (nothing at import)


def _remote() -> Any:
    if not _REMOTE:
        import ray

        _REMOTE.append(ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                                  retry_exceptions=False)(run_task))
    return _REMOTE[0]


def submit(request: RunRequest, *, runs_dir: str | None = None, keep: bool = False,
           **options: Any) -> Any:
    """Start ``request`` as a Ray task; returns its ObjectRef (see :func:`result`).

    ``options`` go to Ray's ``.options()`` (``num_cpus``, ``max_retries``, ``resources``,
    ``scheduling_strategy``...).
    """
    remote = _remote().options(**options) if options else _remote()
    return remote.remote(request.to_json(), runs_dir, keep)


def result(ref: Any, request_id: str | None = None) -> RunResult:
    """The RunResult of a task from :func:`submit`; Ray's own failures become ``error``."""
    import ray

    try:
        return RunResult.from_json(ray.get(ref))
    except ray.exceptions.RayError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return RunResult.refused(request_id, "error", f"Ray lost the task: {first}")


def map(requests: Iterable[RunRequest], *, in_flight: int | None = None,
        runs_dir: str | None = None, keep: bool = False, **options: Any
        ) -> Iterator[RunResult]:
    """Run every request as a task; yield the results as they finish.

    At most ``in_flight`` tasks are submitted ahead (default: twice the cluster's CPUs), so
    a long iterable of requests is consumed only as fast as the cluster runs them.
    """
    import ray

    api: Any = ray  # parts of Ray's API are untyped
    bound = in_flight or max(2 * int(api.cluster_resources().get("CPU", 1)), 2)
    pending: dict[Any, str | None] = {}
    for request in requests:
        pending[submit(request, runs_dir=runs_dir, keep=keep, **options)] = request.id
        while len(pending) >= bound:
            yield from _finished(pending)
    while pending:
        yield from _finished(pending)


def _finished(pending: dict[Any, str | None]) -> Iterator[RunResult]:
    import ray

    ready, _ = ray.wait(list(pending), num_returns=1)
    for ref in ready:
        yield result(ref, pending.pop(ref))
