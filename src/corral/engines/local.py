"""The local engine: a pool of threads on this machine, each calling the one launcher.

Threads, not processes: a run spends almost all its time waiting on its sandbox, the
launcher's own work is short, and every protection (the per-thread filesystem identity of
:func:`corral.fsops.acting_as` included) is already safe to use from several threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ..execute import run_request
from ..request import RunRequest
from ..result import RunResult

__all__ = ["LocalPool", "default_workers", "run_safely"]

IN_FLIGHT_PER_WORKER = 2  # requests handed to the pool ahead of time, per worker
# A run spends much of its wall time waiting (bwrap's setup, the init, the cgroup's teardown),
# so two runs per core keep the cores busier than one: on 2 cores, bench/scale.py found 4
# workers at least as fast as 2 in every run, and up to twice as fast on a busy machine.
WORKERS_PER_CORE = 2


def default_workers() -> int:
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def run_safely(request: RunRequest, runs_dir: str | None, keep: bool) -> RunResult:
    """:func:`run_request`, with any failure of corral itself as a result, never a crash of
    the batch (run_request already turns bad requests and setup failures into results)."""
    try:
        return run_request(request, runs_dir=runs_dir, keep=keep)
    except Exception as e:  # a bug in corral: one job's result says so, the rest go on
        return RunResult.refused(request.id, "error", f"corral failed: {type(e).__name__}: {e}")


class LocalPool:
    """Runs up to ``workers`` requests at a time (default: two per core)."""

    name = "local"

    def __init__(self, workers: int | None = None, *, runs_dir: str | None = None,
                 keep: bool = False) -> None:
        self.workers = workers or default_workers()
        self.runs_dir = runs_dir
        self.keep = keep

    def map(self, requests: Iterable[RunRequest]) -> Iterator[RunResult]:
        """Results as they finish; requests are taken from ``requests`` only as fast as the
        pool can start them.

        Ctrl-C while waiting: requests not started yet are dropped, the running ones finish
        (each within its own timeout) and their results are still yielded; then
        KeyboardInterrupt goes on to the caller.
        """
        bound = self.workers * IN_FLIGHT_PER_WORKER
        pending: set[Future[RunResult]] = set()
        interrupted = False
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="corral-run")
        try:
            try:
                for request in requests:
                    pending.add(pool.submit(run_safely, request, self.runs_dir, self.keep))
                    while len(pending) >= bound:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        yield from (f.result() for f in done)
            except KeyboardInterrupt:
                interrupted = True
                pending = {f for f in pending if not f.cancel()}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
            if interrupted:
                raise KeyboardInterrupt
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
