"""The CLI's start (issue 12): what ``corral run`` no longer loads, and that the cheaper
ways of doing the same work give the same answers as the ones they replace.

Speed itself is measured by bench/floor.py, never asserted here.  What is asserted: the
modules a ``corral run -- /bin/true`` process holds at its end (as root and as the test
user), with a control run that does need one of them (a user's own TOML profile: tomllib),
so that the check cannot pass by seeing nothing; and each replacement against the original.
"""

from __future__ import annotations

import calendar
import datetime
import json
import os
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import Identity
from corral import cgroups, inner, profcache, profiles, resolve

# What the run path used to import and does not need: OpenSSL through secrets (export),
# calendar/datetime through strptime (the cgroup sweep), tomllib (shipped profiles), the
# Python init (two Landlock numbers).
NOT_LOADED = {"secrets", "hashlib", "_hashlib", "hmac", "random", "calendar", "datetime",
              "_strptime", "tomllib", "corral.inner"}

MODULES = """\
import json, sys
from corral.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"rc": code, "modules": sorted(sys.modules)}))
"""


def _modules(who: Identity, *args: str) -> set[str]:
    script = who.tmp / "modules.py"
    script.write_text(MODULES)
    script.chmod(0o644)
    python = who.prefix()[-1]  # who.run adds the change of user
    proc = who.run([python, str(script), "run", *args, "--", "/bin/true"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, proc.stderr
    return set(out["modules"])


@pytest.mark.sandbox
def test_corral_run_does_not_load_what_it_does_not_use(who: Identity) -> None:
    loaded = _modules(who)
    assert "corral.api" in loaded and "json" in loaded  # the helper saw the run's modules
    assert loaded & NOT_LOADED == set()
    # Control: a profile of the user's own, a shipped one's text with one more line, is
    # not in the cache and must be parsed by tomllib, which the check then sees.
    mine = who.tmp / "mine.toml"
    mine.write_text((Path(profiles.SHIPPED) / "shell.toml").read_text() + "# mine\n")
    mine.chmod(0o644)
    assert {"tomllib", "datetime"} <= _modules(who, "--profile", str(mine))


def test_landlock_rights_agree_with_the_init() -> None:
    assert (resolve.FS_WRITE_FILE, resolve.FS_TRUNCATE) == (inner.FS_WRITE_FILE,
                                                            inner.FS_TRUNCATE)


@given(st.datetimes(min_value=datetime.datetime(1000, 1, 1)))
def test_run_stamps_parse_as_strptime_did(when: datetime.datetime) -> None:
    stamp = when.strftime("%Y%m%dT%H%M%S")
    assert cgroups._utc_seconds(stamp) == calendar.timegm(time.strptime(stamp,
                                                                          "%Y%m%dT%H%M%S"))


def test_impossible_stamps_are_not_times() -> None:
    for y in (1900, 2000, 2024, 2025):
        for m in range(14):
            for d in range(33):
                for clock in ("000000", "235959", "240000", "236000", "235962"):
                    stamp = f"{y:04d}{m:02d}{d:02d}T{clock}"
                    try:
                        want: float | None = calendar.timegm(
                            time.strptime(stamp, "%Y%m%dT%H%M%S"))
                    except ValueError:
                        want = None
                    assert cgroups._utc_seconds(stamp) == want, stamp
    for odd in ("", "2026010T000000", "20260101 000000", "20260101T00000x", "+0260101T000000"):
        assert cgroups._utc_seconds(odd) is None
    assert cgroups._run_time("20260101T000000-0123abcd") == 1767225600.0


def _shipped(name: str) -> bytes:
    return (Path(profiles.SHIPPED) / f"{name}.toml").read_bytes()


def test_profile_cache_gives_what_tomllib_gives() -> None:
    assert os.path.exists(profcache._path()), "make setup writes profiles.cache"
    for name in profiles.builtin_profiles():
        text = _shipped(name)
        got = profcache.lookup(text)
        assert got == tomllib.loads(text.decode()), name
        assert got is not None
        got.clear()  # each caller's data is its own: the next lookup is whole again
        assert profcache.lookup(text) == tomllib.loads(text.decode()), name
    assert profcache.lookup(_shipped("shell") + b"\n# edited\n") is None  # tomllib's, then


def test_profile_cache_is_used_only_when_trusted(tmp_path: Path) -> None:
    text = _shipped("shell").decode()
    forged = tmp_path / "profiles.cache"
    forged.write_text(json.dumps({"format": profcache.FORMAT,
                                  "texts": {text: json.dumps({"description": "forged"})}}))
    try:
        forged.chmod(0o644)  # control: a file like the real one is read
        assert profcache.lookup(text.encode(), str(forged)) == {"description": "forged"}
        profcache._texts.cache_clear()
        forged.chmod(0o666)  # writable by others: never read
        assert profcache.lookup(text.encode(), str(forged)) is None
    finally:
        profcache._texts.cache_clear()


def test_profile_cache_write_round_trips(tmp_path: Path) -> None:
    path = profcache.write(str(tmp_path / "profiles.cache"))
    try:
        for name in profiles.builtin_profiles():
            text = _shipped(name)
            assert profcache.lookup(text, path) == tomllib.loads(text.decode()), name
    finally:
        profcache._texts.cache_clear()
