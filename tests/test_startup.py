"""The CLI's start (issue 12): what ``corral run`` no longer loads, and that the cheaper
ways of doing the same work give the same answers as the ones they replace.

Speed itself is measured by bench/floor.py, never asserted here.  What is asserted: the
modules a ``corral run -- /bin/true`` process holds at its end (as root and as the test
user), with a control run that does need one of them (a user's own TOML profile: tomllib),
so that the check cannot pass by seeing nothing; and each replacement against the original.
"""

from __future__ import annotations

import calendar
import copy
import datetime
import json
import os
import pickle
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import Identity
from corral import cgroups, inner, profcache, profiles, record, resolve

# What the run path used to import and does not need: OpenSSL through secrets (export),
# calendar/datetime through strptime (the cgroup sweep), tomllib (shipped profiles), the
# Python init (two Landlock numbers).
NOT_LOADED = {"secrets", "hashlib", "_hashlib", "hmac", "random", "calendar", "datetime",
              "_strptime", "tomllib", "corral.inner",
              # dataclasses and what it imports (corral.record stands in on the run path)
              "dataclasses", "inspect", "ast", "dis", "tokenize",
              # the git and scan parts the audit and resolve need only for a git directory
              # in the workspace or a --ro directory
              "corral.discover", "corral.repos", "corral.gitstate", "corral.gitconfig",
              "corral.locate",
              # quoting for --dry-run's lines
              "shlex",
              # argparse and gettext: the plain use of run is parsed from corral.options
              "argparse", "gettext", "corral.parsers",
              # typing: the run path's modules import it for mypy only (corral.record)
              "typing",
              # json (with re and enum), signal's enums, subprocess (with locale, selectors,
              # warnings), zlib, math, termios: corral.jsonio, corral.sig, launch.spawn's
              # posix_spawn, the tty module only at a terminal
              "json", "re", "enum", "signal", "subprocess", "locale", "selectors", "zlib",
              "math", "termios", "corral.tty"}

# (It imports nothing itself: json, importlib and the like would be seen as the run's.)
MODULES = """\
import sys
for name in filter(None, sys.argv[1].split(",")):  # the controls' deliberate imports
    __import__(name)
from corral.cli import main
try:
    main(sys.argv[2:])
except SystemExit as e:
    code = e.code
print(code, ",".join(sorted(sys.modules)))
"""


def _modules(who: Identity, *args: str, first: str = "", env: dict[str, str] | None = None
             ) -> set[str]:
    """The modules of a ``corral run ARGS -- /bin/true`` at its end; ``first``: modules
    (NAME,NAME) imported before the CLI, for a control."""
    script = who.tmp / "modules.py"
    script.write_text(MODULES)
    script.chmod(0o644)
    python = who.prefix()[-1]  # who.run adds the change of user
    proc = who.run([python, str(script), first, "run", *args, "--", "/bin/true"], env=env)
    assert proc.returncode == 0, proc.stderr
    code, modules = proc.stdout.strip().splitlines()[-1].split()
    assert code == "0", proc.stderr
    return set(modules.split(","))


@pytest.mark.sandbox
def test_corral_run_does_not_load_what_it_does_not_use(who: Identity) -> None:
    loaded = _modules(who)
    assert "corral.api" in loaded and "corral.jsonio" in loaded  # it saw the run's modules
    assert loaded & NOT_LOADED == set()
    # Control: the Python init's start needs a preexec_fn, so subprocess.
    assert {"subprocess", "signal"} <= _modules(who, env={"CORRAL_INIT": "python"})
    # Control: a profile of the user's own, a shipped one's text with one more line, is
    # not in the cache and must be parsed by tomllib, which the check then sees.
    mine = who.tmp / "mine.toml"
    mine.write_text((Path(profiles.SHIPPED) / "shell.toml").read_text() + "# mine\n")
    mine.chmod(0o644)
    assert {"tomllib", "datetime"} <= _modules(who, "--profile", str(mine))
    # Control: a --ro directory is scanned for secrets (corral.discover), and a workspace
    # holding a bare repository has it audited (repos, gitstate, gitconfig).
    ro = who.tmp / "ro"
    ro.mkdir()
    ro.chmod(0o755)
    assert {"corral.discover", "corral.locate"} <= _modules(who, "--ro", str(ro))
    ws = who.tmp / "ws"
    for part in ("", "x.git", "x.git/objects", "x.git/refs"):
        (ws / part).mkdir()
        (ws / part).chmod(0o755)
    (ws / "x.git/HEAD").write_text("ref: refs/heads/main\n")
    (ws / "x.git/HEAD").chmod(0o644)
    who.chown(ws)
    assert {"corral.repos", "corral.gitstate", "corral.gitconfig"} <= _modules(
        who, "--workspace", str(ws))
    assert "shlex" in _modules(who, "--dry-run")
    # Control: an abbreviated option is argparse's to read.
    assert {"argparse", "corral.parsers"} <= _modules(who, "--tim", "60")
    # Control: a module of the list imported on purpose before the CLI is seen.
    assert {"dataclasses", "inspect"} <= _modules(who, first="dataclasses") & NOT_LOADED


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


# corral.record against what it replaces: the same class body as a dataclass and as a
# Record, and as a typing.NamedTuple and a corral.record.NamedTuple.
BODY = """
class Sample(BASE):
    \"\"\"A sample.\"\"\"

    name: str
    blob: bytes = FIELD
    size: int = 3
    tags: list[str] = FACTORY

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("negative")

    def twice(self) -> int:
        return self.size * 2
"""


def _sample(kind: str, frozen: bool) -> type:
    ns: dict[str, object] = {"__name__": __name__}  # a module dataclasses can look up
    if kind == "dataclass":
        import dataclasses

        ns.update(BASE="object", FIELD=dataclasses.field(default=b"", repr=False),
                  FACTORY=dataclasses.field(default_factory=list))
        exec(BODY.replace("(BASE)", ""), ns)
        return dataclasses.dataclass(frozen=frozen, slots=True)(ns["Sample"])  # type: ignore
    ns.update(BASE=record.Record, FIELD=record.field(default=b"", repr=False),
              FACTORY=record.field(default_factory=list))
    exec(BODY.replace("(BASE)", "(BASE, frozen=True)" if frozen else "(BASE)"), ns)
    return ns["Sample"]  # type: ignore[return-value]


def _outcome(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        return type(e)


CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    (("a",), {}), (("a", b"x", 4), {}), ((), {"name": "a", "size": 5}), (("a",), {"tags": ["t"]}),
    ((), {}), (("a",), {"name": "b"}), (("a",), {"bogus": 1}), (("a", b"", 1, [], 9), {}),
    (("a",), {"size": -1})]


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_record_behaves_as_the_dataclass(frozen: bool, args: tuple[object, ...],
                                         kwargs: dict[str, object],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    dc, rc = _sample("dataclass", frozen), _sample("record", frozen)
    monkeypatch.setitem(globals(), "Sample", rc)  # where pickle finds the class
    want, got = _outcome(dc, *args, **kwargs), _outcome(rc, *args, **kwargs)
    if isinstance(want, type):  # the same error: TypeError for the call, ValueError post-init
        assert isinstance(got, type) and issubclass(got, want)
        return
    assert not isinstance(got, type), got
    assert repr(got) == repr(want)  # blob: repr=False in both
    assert [getattr(got, n) for n in record.field_names(rc)] == [
        getattr(want, f.name) for f in dataclasses.fields(want)]  # type: ignore[arg-type]
    assert got.twice() == want.twice()  # type: ignore[attr-defined]
    moved = record.replace(got, size=7)
    assert repr(moved) == repr(dataclasses.replace(want, size=7)) and moved != got
    assert _outcome(record.replace, got, size=-1) is ValueError  # __post_init__ runs again
    assert pickle.loads(pickle.dumps(got)) == got and copy.deepcopy(got) == got
    assert got != want and rc.__match_args__ == dc.__match_args__  # type: ignore[attr-defined]
    # a list field: unhashable, frozen or not, as the dataclass
    assert _outcome(hash, got) is _outcome(hash, want) is TypeError
    if frozen:
        for change in (_outcome(setattr, got, "size", 1), _outcome(delattr, got, "size")):
            assert isinstance(change, type) and issubclass(change, AttributeError)
        assert got == rc(*args, **kwargs)  # unchanged
    else:
        got.size = 8  # type: ignore[attr-defined]
        assert got.size == 8  # type: ignore[attr-defined]
    fresh = rc("a")
    fresh.tags.append("x")
    assert rc("a").tags == []  # each instance its own default
    assert record.replace(dc("a"), size=9) == dc("a", size=9)  # a dataclass: handed on


def test_frozen_records_hash_by_value() -> None:
    from corral.policy import Limits, Policy

    assert hash(Policy()) == hash(Policy()) and Policy() == Policy()
    assert record.replace(Policy(), limits=Limits(pids=9)) != Policy()
    assert {Policy(), Policy(), Policy(name="x")} == {Policy(), Policy(name="x")}


def test_record_field_order_is_checked() -> None:
    for base in ("record.Record", "record.NamedTuple"):
        with pytest.raises(TypeError, match="follows"):
            exec(f"class Bad({base}):\n    a: int = 1\n    b: int\n", {"record": record,
                                                                         "__name__": "bad"})
    exec("class Good(record.Record):\n    b: int\n    a: int = 1\n", {"record": record,
                                                                       "__name__": "good"})


NT_BODY = """
class Sample(BASE):
    \"\"\"A sample.\"\"\"

    name: str
    size: int = 3
    tags: tuple[str, ...] = ()

    def twice(self) -> int:
        return self.size * 2
"""


def test_named_tuple_is_typings() -> None:
    import typing

    made: list[Any] = []
    for base in (typing.NamedTuple, record.NamedTuple):
        ns: dict[str, object] = {"__name__": "sample", "BASE": base}
        exec(NT_BODY, ns)
        made.append(ns["Sample"])
    want, got = made
    for attr in ("_fields", "_field_defaults", "__doc__", "__qualname__", "__module__",
                 "__match_args__", "__mro__"):
        assert (attr, getattr(got, attr)) == (attr, getattr(want, attr)) or attr == "__mro__"
    assert [c.__name__ for c in got.__mro__] == [c.__name__ for c in want.__mro__]
    assert list(got.__annotations__) == list(want.__annotations__)
    for args in (("a",), ("a", 4), ("a", 4, ("t",))):
        w, g = want(*args), got(*args)
        assert (repr(g), tuple(g), g._asdict(), g.twice()) == (repr(w), tuple(w), w._asdict(),
                                                               w.twice())
        assert g._replace(size=1) == w._replace(size=1) and hash(g) == hash(w)
        assert g == type(g)._make(tuple(g))
    g = got("a", tags=("t",))
    assert (g.name, g.size, g.tags) == ("a", 3, ("t",)) == tuple(g)
    for call, message in ((lambda: got(), "missing"), (lambda: got("a", 1, (), 4), "positional"),
                          (lambda: got("a", name="b"), "multiple"),
                          (lambda: got("a", bogus=1), "unexpected")):
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError):
        g._replace(bogus=1)
    from corral.bwrap import RoBind  # a class pickle can find by name

    bound = RoBind("/a", "/b")
    assert pickle.loads(pickle.dumps(bound)) == bound and copy.deepcopy(bound) == bound
    assert type(pickle.loads(pickle.dumps(bound))) is RoBind
    for bad in ('class X(BASE):\n    a: int = 1\n    b: int\n',
                'class X(BASE):\n    a: int\n    def _asdict(self): pass\n'):
        errors: list[Any] = []
        for base in (typing.NamedTuple, record.NamedTuple):
            try:
                exec(bad, {"__name__": "sample", "BASE": base})
                errors.append(None)
            except Exception as e:
                errors.append(type(e))
        assert errors[0] is not None and errors[1] is not None
        assert issubclass(errors[1], errors[0]) or issubclass(errors[0], errors[1])


def test_run_path_named_tuples_are_namedtuples() -> None:
    from corral import (
        audit,
        bwrap,
        export,
        fsops,
        guard,
        host,
        limits,
        locate,
        repos,
        seccomp,
        workspace,
    )

    found = 0
    for module in (audit, bwrap, export, fsops, guard, host, limits, locate, repos, resolve,
                   seccomp, workspace):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, tuple) and hasattr(value, "_fields") \
                    and value.__module__ == module.__name__:
                found += 1
                assert value._fields == tuple(value.__annotations__), value
    assert found >= 30


def test_the_command_runs_nothing_from_the_callers_environment(tmp_path: Path) -> None:
    """``make setup`` writes .venv/bin/corral (scripts/console-scripts), which starts Python
    with -I and -S: a sitecustomize on PYTHONPATH (or a .pth file) does not run inside a
    corral that root started.  Control: pip's kind of script, the same interpreter without
    those flags, runs it."""
    import subprocess
    import sys

    command = Path(sys.executable).with_name("corral")
    assert command.read_text().startswith(f"#!{Path(sys.executable).with_name('python')} -IS\n")
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(planted)}
    r = subprocess.run([str(command), "--version"], env=env, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.startswith("corral "), r
    assert not marker.exists()
    pip_like = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())",
                "--version"]
    r = subprocess.run(pip_like, env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0 and marker.exists(), r  # the control
