"""The decision log of one run: one JSON line per decision, appended as it is made.

The file is ``RUNS/<run-id>/egress.jsonl`` (beside ``record.json``), opened
``O_APPEND`` and written one whole line per ``write``, so a reader never sees
half a line.  A hostile payload can ask for millions of connections, and
make each refusal's reason about a kilobyte long (a name of 63 emoji, shown
escaped), so the file stops before :data:`MAX_BYTES` or after
:data:`MAX_LINES` lines, whichever comes first, with one ``truncated`` line;
only the first :data:`MAX_DENIALS` denials are kept for the run's result.
The file is the launcher's, outside the run's workspace and its disk limit:
this cap is what bounds it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .rules import Decision

__all__ = ["DecisionLog"]

MAX_LINES = 100_000
MAX_BYTES = 8 * 1024 * 1024  # the truncated line included
MAX_DENIALS = 1_000
_ROOM = 256  # kept for the truncated line


class DecisionLog:
    """Appends decisions to a file; keeps the first denials in memory."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd = -1 if path is None else os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.lines = 0
        self.size = 0  # bytes written
        self.full = False  # the truncated line is written; nothing more is
        self.denied = 0
        self.kept: list[dict[str, Any]] = []

    def record(self, protocol: str, decision: Decision) -> None:
        entry = {"time": round(time.time(), 3), "protocol": protocol,
                 "allowed": decision.allowed, "code": str(decision.code),
                 "reason": decision.reason, "host": decision.host, "port": decision.port,
                 "address": decision.address, "rule": decision.rule}
        if not decision.allowed:
            self.denied += 1
            if len(self.kept) < MAX_DENIALS:
                self.kept.append({k: entry[k] for k in ("protocol", "code", "reason", "host",
                                                        "port")})
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        if self.fd < 0 or self.full:
            return
        line = (json.dumps(entry) + "\n").encode()
        if self.lines >= MAX_LINES or self.size + len(line) > MAX_BYTES - _ROOM:
            self.full = True
            line = (json.dumps({"time": entry["time"], "truncated": True,
                                "reason": f"over {MAX_LINES} decisions or {MAX_BYTES >> 20} "
                                          "MiB; later ones are not logged"}) + "\n").encode()
        self.lines += 1
        self.size += len(line)
        try:
            os.write(self.fd, line)
        except OSError:
            self.close()  # a full disk must not stop the proxy

    def denials(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.kept)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
