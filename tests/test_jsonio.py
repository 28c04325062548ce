"""corral.jsonio, the launch path's JSON on CPython's C encoder and scanner, holds to the
json package: the same text out, the same values in, the same kind of error."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import jsonio

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
           | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(), inner, max_size=5), max_leaves=30)


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(values, st.booleans())
def test_the_text_is_json_dumps_own(value: object, sort_keys: bool) -> None:
    assert jsonio.dumps(value, sort_keys=sort_keys) == json.dumps(value, sort_keys=sort_keys)


@settings(max_examples=400, deadline=None)
@given(values, st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_what_is_read_is_json_loads_own(value: object, space: str) -> None:
    text = space + json.dumps(value, indent=1 if isinstance(value, dict) else None) + space
    assert _same(jsonio.loads(text), json.loads(text))
    assert _same(jsonio.loads(text.encode()), json.loads(text))


@pytest.mark.parametrize("text", ["", " ", "{", "[1,]", "1 2", "nul", "\"a", "{\"a\" 1}",
                                  "[1] x", "\ufeff[]", "01", "--1"])
def test_bad_json_is_refused_like_json_does(text: str) -> None:
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(ValueError) as ours:
        jsonio.loads(text)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_what_json_cannot_encode_is_refused_like_json_does() -> None:
    loop: list[object] = []
    loop.append(loop)
    for bad in (object(), {1j: 1}, loop):
        with pytest.raises((TypeError, ValueError)) as theirs:
            json.dumps(bad)
        with pytest.raises((TypeError, ValueError)) as ours:
            jsonio.dumps(bad)
        assert type(ours.value) is type(theirs.value)
    # After an error part-way through, the next call is not refused as circular.
    assert jsonio.dumps([loop[:0], 1]) == "[[], 1]"


def test_invalid_utf8_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        jsonio.loads(b"\"\xff\"")
