"""Each benchmark script owns one marked section of bench/RESULTS.md and replaces only it."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(script: str, text: str) -> None:
    """Replace (or append) the section between ``<!-- bench/SCRIPT:begin/end -->``."""
    begin, end = f"<!-- bench/{script}:begin -->", f"<!-- bench/{script}:end -->"
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in old:
        head, _, rest = old.partition(begin)
        _, _, tail = rest.partition(end)
        new = f"{head}{begin}\n{text.rstrip()}\n{end}{tail}"
    else:
        new = f"{old.rstrip()}\n\n{begin}\n{text.rstrip()}\n{end}\n"
    RESULTS.write_text(new)
