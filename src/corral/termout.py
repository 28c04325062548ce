"""What the sandbox prints to the user's terminal: everything but the clipboard (pure).

The relay (corral.tty) hands the payload's output to the user's terminal emulator, which
acts on the escape sequences in it.  One of them reaches past the terminal: OSC 52
(``ESC ] 52 ; c ; BASE64 BEL``) sets the clipboard of the user's desktop, or of a
terminal multiplexer, so that the next paste into a shell on the host types what the
payload chose; with ``?`` in place of the data it asks the emulator to type the
clipboard back, into the sandbox.  kitty (OSC 5522) and iTerm2 (OSC 1337 ``Copy=``, and
its file transfers) have their own.  :class:`Output` removes those three OSCs however the
stream is split into reads, and every DCS (device control string), since the multiplexer
passthrough wrappers (``ESC P tmux; ... ESC \\``, screen's) carry sequences to the outer
terminal unread: sixel images and terminal-capability queries go with them.  Everything
else (colours, cursor, titles, links) passes unchanged.

Sequences are introduced by ``ESC ]`` (OSC) and ``ESC P`` (DCS), or by their 8-bit
forms U+009D and U+0090 as UTF-8 (``C2 9D``, ``C2 90``), which some emulators honour;
they end at BEL (OSC only), ``ESC \\`` or U+009C, and CAN or SUB cancels them.  A raw
0x9D or 0x90 byte is UTF-8 continuation, not a control, to an emulator in UTF-8 mode.
"""

from __future__ import annotations

__all__ = ["Output"]

ESC, BEL, CAN, SUB = 0x1B, 0x07, 0x18, 0x1A
INTRODUCERS = {b"\x1b]": "osc", b"\xc2\x9d": "osc", b"\x1bP": "dcs", b"\xc2\x90": "dcs"}
# The clipboard's OSCs: xterm's 52, kitty's 5522, iTerm2's 1337 (``Copy=``, and the file
# transfers of its other keys): read as the emulator does, as a number (``052`` is 52).
DROPPED = frozenset({52, 1337, 5522})
MAX_HEAD = 16  # bytes of an OSC's introducer and number held across reads


class Output:
    """A filter for one stream: ``feed`` each read, write what it returns."""

    def __init__(self) -> None:
        self.held = b""  # an introducer or an OSC number that a read cut in two
        self.dropping: str | None = None  # "osc" or "dcs": inside a sequence being removed
        self.prev = 0  # the byte before, while dropping (ESC then ``\\`` ends it)

    def feed(self, data: bytes) -> bytes:
        data, self.held = self.held + data, b""
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self.dropping is not None:
                i = self._skip(data, i)
                continue
            j = _next_start(data, i)
            if j < 0:
                out += data[i:]
                break
            out += data[i:j]
            if j + 2 > n:
                self.held = data[j:]
                break
            if INTRODUCERS[data[j:j + 2]] == "dcs":  # passthrough wrappers, and any DCS
                self.dropping, self.prev, i = "dcs", 0, j + 2
                continue
            k = j + 2
            while k < n and k - j < MAX_HEAD and 0x30 <= data[k] <= 0x39:
                k += 1
            if k == n and k - j < MAX_HEAD:
                self.held = data[j:]  # its number may go on in the next read
                break
            if k > j + 2 and int(data[j + 2:k]) in DROPPED:
                self.dropping, self.prev, i = "osc", 0, k
                continue
            out += data[j:k]  # another OSC (a title, a link): as it is; its text is read on
            i = k
        return bytes(out)

    def _skip(self, data: bytes, i: int) -> int:
        """Past the end of the sequence being dropped, or to the end of ``data``."""
        for k in range(i, len(data)):
            b, prev = data[k], self.prev
            self.prev = b
            if b in (CAN, SUB) or (b == 0x5C and prev == ESC) or (b == 0x9C and prev == 0xC2) \
                    or (b == BEL and self.dropping == "osc"):
                self.dropping = None
                return k + 1
        return len(data)


def _next_start(data: bytes, i: int) -> int:
    """Where the next introducer starts (or its first byte, last in ``data``), else -1."""
    k = i
    while True:
        hits = [h for h in (data.find(b"\x1b", k), data.find(b"\xc2", k)) if h >= 0]
        if not hits:
            return -1
        k = min(hits)
        if k + 1 >= len(data) or data[k:k + 2] in INTRODUCERS:
            return k
        k += 1
