"""The shipped profiles, parsed once by ``make setup`` into ``profiles.cache`` beside them.

``tomllib`` (with the ``datetime`` and regular expressions it loads) costs every
``corral run`` ~2-5 ms to parse a file of twenty lines.  A TOML text always parses
to the same data, so the cache maps each shipped profile's exact text to what
``tomllib`` made of it, and a text is looked up by equality: an edited profile, a
user's file, or a missing or untrusted cache (checked as a file like
``seccomp.cache``: regular, owned like the code, writable by no one else) is
parsed by ``tomllib`` as before.  The cache can make a start slower, never
different.

    python -m corral.profcache --write    # what make setup runs
"""

from __future__ import annotations

import os
import sys

from . import jsonio, small
from .seccache import read_trusted, write_json

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CACHE_NAME", "FORMAT", "lookup", "write"]

CACHE_NAME = "profiles.cache"
FORMAT = "corral-profiles-cache 1"


def _path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), CACHE_NAME)


@small.cache
def _texts(path: str) -> dict[str, Any]:
    raw = read_trusted(path)
    try:
        data = jsonio.loads(raw) if raw is not None else {}
        if data.get("format") == FORMAT and isinstance(data.get("texts"), dict):
            return data["texts"]  # type: ignore[no-any-return]
    except (ValueError, AttributeError):
        pass
    return {}


def lookup(text: bytes, path: str | None = None) -> dict[str, Any] | None:
    """What tomllib.loads(text) returns, when ``text`` is a shipped profile's; else None."""
    try:
        key = text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    found = _texts(path or _path()).get(key)
    if not isinstance(found, str):
        return None
    try:  # decoded at each call: the caller gets data of its own, as from tomllib
        data = jsonio.loads(found)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 and 1.0 are equal, not the same)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def write(path: str | None = None) -> str:
    """Parse every shipped profile and write the cache, atomically; returns the path."""
    import tomllib

    from .profiles import SHIPPED, builtin_profiles

    texts: dict[str, str] = {}
    for name in builtin_profiles():
        with open(os.path.join(SHIPPED, f"{name}.toml"), "rb") as f:
            text = f.read().decode("utf-8")  # as lookup() decodes: no newline translation
        data = tomllib.loads(text)
        encoded = jsonio.dumps(data)
        if _same(jsonio.loads(encoded), data):  # else (a TOML date, say) left to tomllib
            texts[text] = encoded
    return write_json(path or _path(), {"format": FORMAT, "texts": texts})


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m corral.profcache --write")
    print(f"corral: shipped profiles parsed into {write()}")
