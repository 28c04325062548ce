"""The probe's report: a table for people, JSON for programs, and the checks' documentation.

``--json`` prints :meth:`Report.to_json`: ``verdict`` ("pass" only when every
check passed), ``launcher``, counts, and ``checks``, a list of objects with
``id``, ``category``, ``attempted``, ``expected``, ``observed`` and ``passed``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .checks import CATEGORIES, Check

__all__ = ["CheckResult", "Report", "markdown", "render_text"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    category: str
    attempted: str
    expected: str
    observed: str
    passed: bool


@dataclass(frozen=True, slots=True)
class Report:
    launcher: str
    checks: tuple[CheckResult, ...]
    wall_s: float
    run: str = ""  # the run's id: every planted path and marker carries corral-probe-<run>

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": "pass" if self.passed else "fail", "launcher": self.launcher,
                "passed": len(self.checks) - len(self.failed), "failed": len(self.failed),
                "wall_s": round(self.wall_s, 2), "run": self.run,
                "checks": [asdict(c) for c in self.checks]}


def render_text(report: Report, width: int | None = None) -> str:
    """Grouped by category, failures first in each, one line per check, then the verdict.

    Lines are cut at ``width`` (a terminal's); None keeps them whole.
    """
    name_w = max((len(c.id) for c in report.checks), default=10)
    lines = [f"corral probe: {report.launcher}", ""]
    for key, title in CATEGORIES.items():
        group = [c for c in report.checks if c.category == key]
        if not group:
            continue
        bad = [c for c in group if not c.passed]
        lines.append(_fit(f"{title} ({len(group)} checks, {len(bad)} failed)", width))
        for c in [*bad, *(c for c in group if c.passed)]:
            head = f"  {'FAIL' if not c.passed else 'pass'}  {c.id:<{name_w}}  "
            text = c.observed if c.passed else f"{c.observed}  [expected: {c.expected}]"
            lines.append(_fit(head + text, width))
        lines.append("")
    lines.append(verdict_line(report))
    return "\n".join(lines)


def verdict_line(report: Report) -> str:
    total, bad = len(report.checks), report.failed
    if not bad:
        return f"verdict: PASS: all {total} checks passed ({report.wall_s:.1f} s)"
    names = ", ".join(c.id for c in bad[:6]) + (", ..." if len(bad) > 6 else "")
    return f"verdict: FAIL: {len(bad)} of {total} checks failed ({names}) ({report.wall_s:.1f} s)"


def _fit(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[:width - 1] + "…"


def markdown(checks: Iterable[Check]) -> str:
    """The per-check section of docs/probe.md, generated from the catalogue."""
    out: list[str] = []
    checks = list(checks)
    for key, title in CATEGORIES.items():
        group = [c for c in checks if c.category == key]
        out += [f"### {title[0].upper()}{title[1:]} ({len(group)})", ""]
        for c in group:
            out.append(f"- **`{c.id}`**: {c.attempted}.")
            out += textwrap.wrap(f"Why: {c.why}.", 92, initial_indent="  ",
                                 subsequent_indent="  ")
            out += textwrap.wrap(f"Passing means: {c.expected}.", 92, initial_indent="  ",
                                 subsequent_indent="  ")
        out.append("")
    return "\n".join(out)
