"""``corral batch``: run a JSON-lines file of requests, one result line per request.

* Jobs are read lazily, one line at a time (each at most MAX_LINE bytes); a line that is not a
  valid request becomes one result with status ``invalid`` and the reason, never a crash.
  A job without an ``id`` gets ``line-N`` (its line number); a line that repeats an earlier
  line's id is ``invalid``, under the id ``line-N``.  Only line N may name itself ``line-N``,
  so every id has one result.
* Results are appended to the output as they finish, one line each, flushed at once.  With
  ``--resume``, the ids already in the output are skipped, so every job gets exactly one
  result however often the batch is interrupted; a last line cut short by a crash is dropped
  and its job runs again.  Without ``--resume`` an existing, non-empty output is refused.
* On a terminal, a live progress display (``tqdm``, from ``corral[progress]``); otherwise, or
  without it, a plain line every few seconds.  A summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

from .engines import Engine
from .errors import UsageError
from .options import Args
from .record import replace
from .request import RunRequest, parse_json
from .result import RunResult

__all__ = ["Results", "Tally", "add_arguments", "jobs", "main", "run_batch"]

MAX_LINE = 128 << 20  # one job's line: 64 MiB of files, base64-encoded, and some room
LINE_ID = re.compile(r"line-([0-9]+)")
PLAIN_EVERY_S = 5.0


def foreign_line_id(given: str, number: int) -> bool:
    """Whether ``given`` is ``line-M`` for another line than ``number``: the name corral
    gives line M's job when it has no id (and line M's result when it is refused).  Only
    line N may be called ``line-N``, so those names never collide with a request's own, and
    no result is written under an id another job's result already holds."""
    match = LINE_ID.fullmatch(given)
    return match is not None and int(match.group(1)) != number


def _id_of(data: Any, number: int) -> str:
    """The id an invalid line's result goes under: its own, when that is a usable id."""
    got = data.get("id") if isinstance(data, dict) else None
    try:
        RunRequest(command=("true",), id=got)
    except UsageError:
        got = None
    if not isinstance(got, str) or foreign_line_id(got, number):
        return f"line-{number}"
    return got


def parse_line(line: bytes, number: int) -> RunRequest | RunResult:
    """A request, or the ``invalid`` result that says why the line is not one."""
    try:
        data = parse_json(line)
    except (ValueError, RecursionError) as e:
        return RunResult.refused(f"line-{number}", "invalid", f"line {number} is not JSON; {e}")
    try:
        request = RunRequest.from_json(data)
    except UsageError as e:
        return RunResult.refused(_id_of(data, number), "invalid", str(e))
    if request.id is not None and foreign_line_id(request.id, number):
        return RunResult.refused(f"line-{number}", "invalid", str(UsageError(
            f"line {number} has the id {request.id!r}", "corral names the job of line "
            f"{request.id.removeprefix('line-')} so when it has no id of its own",
            f"give it another id, or line-{number}")))
    return request if request.id is not None else replace(request, id=f"line-{number}")


def jobs(source: IO[bytes], skip: set[str], written: Any) -> Iterator[RunRequest]:
    """The requests of ``source``, lazily; ``invalid`` results go to ``written`` at once.

    ``skip`` holds the ids that already have a result; each id is run once.
    """
    seen: set[str] = set()
    number = 0
    while line := source.readline(MAX_LINE + 1):
        number += 1
        if len(line) > MAX_LINE:
            while line and not line.endswith(b"\n"):  # the rest of an overlong line
                line = source.readline(1 << 20)
            got: RunRequest | RunResult = RunResult.refused(
                f"line-{number}", "invalid", f"line {number} is longer than {MAX_LINE} bytes")
        elif not line.strip():
            continue
        else:
            got = parse_line(line, number)
        if got.id in skip:
            continue
        if got.id in seen:  # its result goes under the line's own id: ids stay unique
            written(RunResult.refused(f"line-{number}", "invalid",
                                      f"line {number} repeats the id {got.id!r} of an "
                                      "earlier line"))
            continue
        seen.add(got.id or "")
        if isinstance(got, RunResult):
            written(got)
        else:
            yield got


class Results:
    """The output file: results appended one line at a time, each written exactly once."""

    def __init__(self, path: str, resume: bool) -> None:
        self.path = path
        self.done = self._existing() if resume else set()
        if not resume and os.path.exists(path) and os.path.getsize(path) > 0:
            raise UsageError(f"{path} already holds results",
                             "a new batch would mix its results with an older one's",
                             "pass --resume to continue that batch, or remove the file")
        self.file = open(path, "ab")  # noqa: SIM115 (closed by close())

    def _existing(self) -> set[str]:
        """Ids with a result; a cut-off last line (a crash mid-write) is removed."""
        done: set[str] = set()
        if not os.path.exists(self.path):
            return done
        with open(self.path, "rb+") as f:
            good = 0
            for number, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    break
                try:
                    done.add(json.loads(line)["id"])
                except (ValueError, KeyError, TypeError):
                    raise UsageError(f"{self.path} line {number} is not a result",
                                     "--resume reads the ids of the results already there",
                                     "fix or remove that line") from None
                good += len(line)
            f.truncate(good)
        return done

    def write(self, result: RunResult) -> bool:
        """Append ``result``, flushed; False (and nothing written) if its id has one."""
        if result.id in self.done:
            return False
        self.file.write(json.dumps(result.to_json()).encode() + b"\n")
        self.file.flush()
        self.done.add(result.id or "")
        return True

    def close(self) -> None:
        self.file.close()


class Tally:
    """Counts for the progress display and the summary."""

    def __init__(self, total: int | None, skipped: int) -> None:
        self.total, self.skipped = total, skipped
        self.by_status: Counter[str] = Counter()
        self.failed = 0
        self.started = time.monotonic()

    def add(self, result: RunResult) -> None:
        self.by_status[result.status] += 1
        self.failed += not result.ok

    @property
    def done(self) -> int:
        return sum(self.by_status.values())

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        of = f"/{self.total - self.skipped}" if self.total is not None else ""
        eta = ""
        if self.total is not None and rate > 0:
            eta = f", ETA {max(self.total - self.skipped - self.done, 0) / rate:.0f}s"
        return (f"{self.done}{of} done, {self.failed} failed, "
                f"{self.by_status['timeout']} timed out, {rate:.1f} runs/s{eta}")

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items()))
        skipped = f"; {self.skipped} already done" if self.skipped else ""
        return (f"corral: batch: {self.done} results in "
                f"{time.monotonic() - self.started:.1f}s ({kinds or 'none'}){skipped}")


class Progress:
    """tqdm on a terminal when it is installed; plain lines every few seconds otherwise."""

    def __init__(self, tally: Tally, stream: IO[str], quiet: bool) -> None:
        self.tally, self.stream, self.quiet = tally, stream, quiet
        self.bar: Any = None
        self.last = time.monotonic()
        if not quiet and stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            remaining = None if tally.total is None else tally.total - tally.skipped
            # A terminal that reports no size (a fresh pty) would get no bar at all.
            sized = _width(stream) > 0
            self.bar = tqdm(total=remaining, unit="run", file=stream, smoothing=0.1,
                            dynamic_ncols=sized, ncols=None if sized else 100,
                            nrows=None if sized else 24)

    def update(self, result: RunResult) -> None:
        self.tally.add(result)
        if self.bar is not None:
            self.bar.set_postfix(failed=self.tally.failed,
                                 timeout=self.tally.by_status["timeout"], refresh=False)
            self.bar.update(1)
        elif not self.quiet and time.monotonic() - self.last >= PLAIN_EVERY_S:
            self.last = time.monotonic()
            print(f"corral: batch: {self.tally.line()}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _width(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 0


def count_lines(path: str) -> int | None:
    """Non-blank lines in a regular file (for the progress display), or None."""
    if path == "-" or not os.path.isfile(path):
        return None
    count = 0
    with open(path, "rb") as f:
        for line in f:
            count += bool(line.strip())
    return count


def run_batch(jobs_path: str, out_path: str, engine: Engine, *, resume: bool = False,
              quiet: bool = False, stream: IO[str] | None = None) -> Tally:
    """Run every job of ``jobs_path`` on ``engine``; results go to ``out_path``."""
    stream = stream or sys.stderr
    try:
        source = sys.stdin.buffer if jobs_path == "-" else open(jobs_path, "rb")  # noqa: SIM115
    except OSError as e:
        raise UsageError(f"cannot read {jobs_path}", e.strerror or str(e),
                         "give a JSON-lines file of requests") from None
    results = Results(out_path, resume)
    tally = Tally(count_lines(jobs_path), len(results.done))
    progress = Progress(tally, stream, quiet)

    def written(result: RunResult) -> None:
        if results.write(result):
            progress.update(result)

    try:
        for result in engine.map(jobs(source, set(results.done), written)):
            written(result)
    finally:
        progress.close()
        results.close()
        if source is not sys.stdin.buffer:
            source.close()
        print(tally.summary(), file=stream, flush=True)
    return tally


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``corral batch``."""
    b.usage = ("corral batch JOBS.jsonl -o RESULTS.jsonl [--workers N] [--engine local|ray] "
               "[--address ADDR] [--resume]")
    b.description = ("Run one request per line of JOBS.jsonl (see docs/requests.md), each in "
                     "fresh sandboxes; write one result per line to RESULTS.jsonl as each "
                     "finishes.  JOBS.jsonl '-' reads standard input.")
    b.add_argument("jobs", metavar="JOBS.jsonl")
    b.add_argument("-o", "--output", required=True, metavar="RESULTS.jsonl")
    b.add_argument("--workers", metavar="N", help="runs at a time (default: two per core; "
                   "with --engine ray: tasks in flight, default twice the cluster's CPUs)")
    b.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this machine; ray: a Ray cluster (corral[ray])")
    b.add_argument("--address", metavar="ADDR", help="the Ray cluster to join (default: "
                   "RAY_ADDRESS, else a new single-node Ray on this machine)")
    b.add_argument("--retries", metavar="N", help="--engine ray: how often Ray runs a job "
                   "again whose node or worker died (default 3)")
    b.add_argument("--resume", action="store_true",
                   help="continue an interrupted batch: skip the ids RESULTS.jsonl holds")
    b.add_argument("--keep", action="store_true",
                   help="keep each run's workspace and record under the runs directory")
    b.add_argument("--runs-dir", metavar="DIR", help="where per-run directories go")
    b.add_argument("--quiet", action="store_true", help="no progress display, only the summary")


def _stop_on_sigterm() -> None:
    """SIGTERM stops like Ctrl-C: no new job starts, the running ones finish and are written."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main(args: Args) -> int:
    """``corral batch``, from its parsed options."""
    from .cli import _count
    from .engines import engine_for

    _stop_on_sigterm()
    workers = int(_count(args.workers, "--workers", int)) if args.workers else None
    retries = None
    if args.retries is not None:
        retries = int(args.retries) if args.retries.isdigit() else -1
        if retries < 0:
            raise UsageError(f"--retries {args.retries!r} is not a count", "",
                             "write it like --retries 3, or 0 for none")
    engine = engine_for(args.engine, workers=workers, address=args.address,
                        runs_dir=args.runs_dir, keep=args.keep, retries=retries)
    run_batch(args.jobs, args.output, engine, resume=args.resume, quiet=args.quiet)
    return 0
