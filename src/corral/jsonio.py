"""JSON for the launch path: CPython's own C encoder and scanner (the ``_json`` module the
json package itself runs on), without importing the json package.

Importing json imports re (and with it enum) and compiles its patterns: with subprocess's
imports, about a fifth of the CPU of a ``corral run -- /bin/true`` went to modules the run
needs for one encoder and one scanner (bench/RESULTS.md, "The launch floor").  The output
is json.dumps's, character for character, with its defaults (ASCII, ``", "`` and ``": "``,
NaN allowed, circular references refused); what is read is what json.loads reads from
a str, or from UTF-8 bytes.  Anything else (an indent, a Python without ``_json``) is
json's own.  tests/test_jsonio.py holds the two to one result.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # another Python: the json package
    _json = None  # type: ignore[assignment]

__all__ = ["dumps", "loads"]

_SPACE = " \t\n\r"  # json's whitespace


def _default(o: object) -> object:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def dumps(obj: Any, *, sort_keys: bool = False) -> str:
    """``json.dumps(obj, sort_keys=sort_keys)``."""
    if _json is None:
        import json

        return json.dumps(obj, sort_keys=sort_keys)
    if isinstance(obj, str):
        return str(_json.encode_basestring_ascii(obj))
    # A new encoder each time: its markers (the containers being encoded, for the circular
    # check) would keep an entry after an error part-way through.
    encode = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None, ": ", ", ",
                                sort_keys, False, True)
    return "".join(encode(obj, 0))


class _Context:
    """What the C scanner reads from a JSONDecoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__


_scan = _json.make_scanner(_Context()) if _json is not None else None  # type: ignore[arg-type]


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``; bytes as UTF-8.  Invalid JSON raises ValueError (json's
    JSONDecodeError, or UnicodeDecodeError), as json.loads does."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    if _scan is None:
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration:
        return _json_error(text)
    if text[end:].strip(_SPACE):
        return _json_error(text)
    return obj


def _json_error(text: str) -> Any:
    """json's own error for ``text``, with its message and position."""
    import json

    return json.loads(text)
