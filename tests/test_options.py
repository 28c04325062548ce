"""The direct parse of ``corral run`` and ``corral agent`` (corral.options) reads every
command line it takes exactly as argparse (corral.parsers) does, and leaves the rest to it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import options, parsers
from corral.errors import UsageError

VALUES = st.sampled_from(["", "5", "256M", "A=1", "a b", "-1", "-x", "--json", "=", "x=",
                          "run", "é", "--"])
FLAGS = st.sampled_from(sorted({o.flag for verb in options.DIRECT
                                for o in options.table(verb)}))
ODD = st.sampled_from(["--tim", "--time", "--allow-d", "-h", "--help", "--bogus", "-c",
                       "--import-state=1", "--json=yes", "x", "--version", "--prefix"])


@st.composite
def words(draw: st.DrawFn) -> list[str]:
    verb = draw(st.sampled_from(["run", "agent", "shell", "doctor"]))
    out = [verb]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 9))
        if kind < 6:
            flag = draw(FLAGS)
            if draw(st.booleans()):
                out.append(f"{flag}={draw(VALUES)}")
            else:
                out += [flag, draw(VALUES)]
        elif kind < 8:
            out.append(draw(FLAGS))
        else:
            out.append(draw(ODD))
    return out


def _argparse(ws: list[str]) -> options.Args | None:
    try:
        return parsers.parse(ws)
    except (UsageError, SystemExit):
        return None


@settings(max_examples=600, deadline=None)
@given(words())
def test_the_direct_parse_agrees_with_argparse(ws: list[str]) -> None:
    direct = options.parse(ws)
    if direct is not None:  # whatever it takes, argparse reads the same way
        assert vars(direct) == vars(_argparse(ws) or options.Args()), ws


@pytest.mark.parametrize("ws", [
    ["run"], ["run", "--json"], ["run", "--timeout", "5", "--env", "A=1", "--env=B=2"],
    ["run", "--allow-domain", "x.test", "--resolve", "x.test:127.0.0.1", "--dry-run"],
    ["agent", "--profile", "claude", "--rw", "/tmp/a", "--import-state"],
])
def test_the_plain_uses_are_read_directly(ws: list[str]) -> None:
    """Control for the property above: these are taken, so it compares something."""
    direct = options.parse(ws)
    assert direct is not None and vars(direct) == vars(parsers.parse(ws))


@pytest.mark.parametrize("ws", [
    ["run", "--tim", "5"], ["run", "--timeout", "-1"], ["run", "-h"], ["run", "--json=1"],
    ["agent", "--json"], ["shell", "-c", "ls"], ["run", "stray"], ["--version"],
    ["run", "--timeout"],
])
def test_the_rest_is_left_to_argparse(ws: list[str]) -> None:
    assert options.parse(ws) is None
