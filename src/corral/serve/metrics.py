"""Counters and latency percentiles of one server, kept in bounded memory."""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

__all__ = ["Metrics"]

WINDOW = 10_000  # latencies kept for the percentiles: the most recent ones


class Metrics:
    """Updated from the server's event loop only (one thread): no locking needed."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.statuses: Counter[str] = Counter()
        self.runs = self.failures = self.rejected = self.bad = 0
        self.latencies: deque[float] = deque(maxlen=WINDOW)

    def finished(self, status: str, ok: bool, seconds: float) -> None:
        self.runs += 1
        self.failures += not ok
        self.statuses[status] += 1
        self.latencies.append(seconds)

    def to_json(self, in_flight: int, workers: int) -> dict[str, Any]:
        ordered = sorted(self.latencies)

        def pct(p: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 6)

        return {
            "uptime_s": round(time.monotonic() - self.started, 3), "runs": self.runs,
            "failures": self.failures, "statuses": dict(self.statuses),
            "rejected": self.rejected, "bad_requests": self.bad,
            "running": min(in_flight, workers), "queue_depth": max(in_flight - workers, 0),
            "latency_s": {"p50": pct(50), "p90": pct(90), "p99": pct(99),
                          "window": len(ordered)},
        }
