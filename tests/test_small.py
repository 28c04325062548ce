"""corral.small against the standard library it stands in for: each helper behaves as
its namesake in contextlib, functools and threading does, case by case, the namesake
run beside it as the reference."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral import small

SRC = Path(__file__).resolve().parent.parent / "src"


def outcome(manager: Callable[[], contextlib.AbstractContextManager[object]],
            body: Callable[[object], object]) -> tuple[str, object]:
    """What a with-block around ``body`` ends with: ("value", what it entered with) or
    ("raised", the exception's type and message)."""
    try:
        with manager() as got:
            body(got)
        return "value", got
    except BaseException as e:  # the very thing compared
        return "raised", (type(e).__name__, str(e))


def raise_(e: BaseException) -> Callable[[object], object]:
    def body(_: object) -> object:
        raise e
    return body


BODIES = {
    "nothing": lambda _: None,
    "ValueError": raise_(ValueError("v")),
    "KeyError": raise_(KeyError("k")),
    "StopIteration": raise_(StopIteration("s")),
    "KeyboardInterrupt": raise_(KeyboardInterrupt()),
    "GeneratorExit": raise_(GeneratorExit()),
}


def generators() -> dict[str, Callable[[], Iterator[object]]]:
    def plain() -> Iterator[object]:
        yield 1

    def catches() -> Iterator[object]:
        try:  # noqa: SIM105 - a generator that catches is the case compared
            yield 2
        except ValueError:
            pass

    def cleans_up() -> Iterator[object]:
        try:
            yield 3
        finally:
            pass

    def replaces() -> Iterator[object]:
        try:
            yield 4
        except Exception as e:
            raise RuntimeError("replaced") from e

    def twice() -> Iterator[object]:
        yield 5
        yield 6

    def never() -> Iterator[object]:
        return
        yield  # a generator that does not yield

    def reraises() -> Iterator[object]:
        try:
            yield 7
        except BaseException:
            raise

    return {f.__name__: f for f in (plain, catches, cleans_up, replaces, twice, never,
                                     reraises)}


@pytest.mark.parametrize("gen", sorted(generators()))
@pytest.mark.parametrize("body", sorted(BODIES))
def test_contextmanager_ends_each_block_as_contextlibs_does(gen: str, body: str) -> None:
    fn = generators()[gen]
    theirs = contextlib.contextmanager(fn)
    ours = small.contextmanager(fn)
    assert outcome(ours, BODIES[body]) == outcome(theirs, BODIES[body])  # type: ignore[arg-type]


@pytest.mark.parametrize("body", sorted(BODIES))
def test_suppress_and_nullcontext_end_each_block_as_contextlibs_do(body: str) -> None:
    for kinds in ((ValueError,), (KeyError, StopIteration), (Exception,), ()):
        assert outcome(lambda k=kinds: small.suppress(*k), BODIES[body]) == outcome(
            lambda k=kinds: contextlib.suppress(*k), BODIES[body])
    assert outcome(lambda: small.nullcontext(9), BODIES[body]) == outcome(
        lambda: contextlib.nullcontext(9), BODIES[body])


def test_cache_keeps_results_per_arguments_as_functools_does() -> None:
    calls: dict[str, int] = {"ours": 0, "theirs": 0}

    def counted(who: str) -> Callable[..., tuple[object, ...]]:
        def f(*args: object, **kwargs: object) -> tuple[object, ...]:
            calls[who] += 1
            return (args, tuple(sorted(kwargs.items())))
        return f

    ours, theirs = small.cache(counted("ours")), functools.cache(counted("theirs"))
    for args, kwargs in [((1,), {}), ((1,), {}), ((1,), {"a": 2}), ((), {"a": 2, "b": 3}),
                         ((), {"b": 3, "a": 2}), (("x", None), {}), ((1, "a", 2), {}),
                         ((1,), {"a": 2})]:
        assert ours(*args, **kwargs) == theirs(*args, **kwargs)
        assert calls["ours"] == calls["theirs"], (args, kwargs)
    ours.cache_clear()  # type: ignore[attr-defined]
    ours(1)
    assert calls["ours"] == calls["theirs"] + 1
    with pytest.raises(TypeError):
        ours([1])  # unhashable, as with functools
    assert ours.__name__ == "f"


def test_cache_last_keeps_only_the_last_result() -> None:
    calls: list[int] = []

    def f(x: int) -> int:
        calls.append(x)
        return x * 2

    g = small.cache_last(f)
    assert [g(1), g(1), g(2), g(1), g(1)] == [2, 2, 4, 2, 2]
    assert calls == [1, 2, 1]  # as functools.lru_cache(maxsize=1)


def test_local_is_per_thread() -> None:
    here = small.local()
    here.x = "main"
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(getattr(here, "x", None)))
    t.start()
    t.join()
    assert seen == [None] and here.x == "main"


def test_corral_run_imports_none_of_what_small_replaces() -> None:
    """The point of corral.small: a `corral run` (the default profile: a disk image when
    root) imports neither contextlib, functools, threading nor collections.  Control: the
    same probe sees them once the script imports contextlib itself.  (A plain user's run
    has no image: its disk watch is a thread, and threading comes with it.)"""
    probe = (f"import sys; sys.path.insert(0, {str(SRC)!r}); import os\n"
             "EXTRA\n"
             "sys.argv = ['corral', 'run', '--', '/bin/true']\n"
             "exit_ = os._exit\n"
             "def seen(n):\n"
             "    names = ('contextlib', 'functools', 'threading', 'collections')\n"
             "    os.write(2, repr(sorted(m for m in names if m in sys.modules)).encode()\n"
             "             + b'\\n'); exit_(0)\n"
             "os._exit = seen\n"
             "sys.exit = seen\n"
             "from corral.cli import main\n"
             "main()\n"
             "seen(0)\n")
    for extra, want in (("", "[]"), ("import contextlib", "['collections', 'contextlib', "
                                                          "'functools']")):
        out = subprocess.run([sys.executable, "-I", "-S", "-c", probe.replace("EXTRA", extra)],
                             capture_output=True, text=True, timeout=120, check=False)
        got = out.stderr.strip().splitlines()[-1]  # (corral holds stdout)
        if os.geteuid() == 0 or extra:
            assert got == want, out
        else:
            assert "contextlib" not in got, out
