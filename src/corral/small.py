"""The few helpers of ``contextlib``, ``functools`` and ``threading`` that corral's start
path uses, written small.  Those three import ``collections`` (and with it ``operator``,
``keyword``, ``reprlib``): about 19 M instructions at every start of ``corral run``, a
fifth of its launcher's own (callgrind; bench/RESULTS.md).  The modules a run or an agent
session imports use these; the others (the egress proxy's, the servers', the probe's) may
use the standard library's.  Each behaves as its namesake does for the way corral uses
it: no more.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator
    from types import TracebackType
    from typing import Any, ParamSpec, TypeVar

    P = ParamSpec("P")
    T = TypeVar("T")
    F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["cache", "contextmanager", "local", "nullcontext", "suppress"]

local = _thread._local  # threading.local
_MARK = object()  # between a call's positional and keyword arguments in its cache key


class suppress:
    """``contextlib.suppress``: the block's exception, if one of ``exceptions``, ends it
    quietly."""

    def __init__(self, *exceptions: type[BaseException]) -> None:
        self.exceptions = exceptions

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool:
        return kind is not None and issubclass(kind, self.exceptions)


class nullcontext:
    """``contextlib.nullcontext``: a block that nothing surrounds."""

    def __init__(self, value: object = None) -> None:
        self.value = value

    def __enter__(self) -> object:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


def cache(fn: F, last_only: bool = False) -> F:
    """``functools.cache`` (``last_only``: ``lru_cache(maxsize=1)``): ``fn``'s result per
    arguments, kept; ``cache_clear()`` forgets them.  Two threads asking at once may both
    compute it, as with functools'; the first answer kept is the one every later call
    gets."""
    memo: dict[object, object] = {}

    def cached(*args: object, **kwargs: object) -> object:
        key = (args, _MARK, *kwargs.items()) if kwargs else args
        try:
            return memo[key]
        except KeyError:
            pass
        value = fn(*args, **kwargs)
        if last_only:
            memo.clear()
        return memo.setdefault(key, value)

    cached.cache_clear = memo.clear  # type: ignore[attr-defined]
    cached.__wrapped__ = fn  # type: ignore[attr-defined]
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(cached, name, getattr(fn, name, None))
    return cached  # type: ignore[return-value]


def cache_last(fn: F) -> F:
    """``functools.lru_cache(maxsize=1)``: only the last arguments' result is kept."""
    return cache(fn, last_only=True)


class _Generated:
    """The context manager of one call of a :func:`contextmanager` generator."""

    def __init__(self, gen: Generator[object, None, None]) -> None:
        self.gen = gen

    def __enter__(self) -> object:
        try:
            return next(self.gen)
        except StopIteration:
            raise RuntimeError("generator didn't yield") from None

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if kind is None:
            try:
                next(self.gen)
            except StopIteration:
                return False
            raise RuntimeError("generator didn't stop")
        if value is None:
            value = kind()
        try:
            self.gen.throw(value)
        except StopIteration as stop:
            return stop is not value  # the generator caught it: the block's end is quiet
        except RuntimeError as err:
            # A StopIteration thrown in comes back as the RuntimeError PEP 479 makes of it.
            if err is value or (isinstance(value, StopIteration) and err.__cause__ is value):
                return False
            raise
        except BaseException as err:
            if err is value:  # not caught: the block's own exception goes on
                return False
            raise
        raise RuntimeError("generator didn't stop after throw()")


def contextmanager(fn: Callable[P, Iterator[T]]) -> Callable[P, _Manager[T]]:
    """``contextlib.contextmanager``, for ``with`` (not as a decorator)."""

    def manager(*args: P.args, **kwargs: P.kwargs) -> _Manager[T]:
        return _Generated(fn(*args, **kwargs))  # type: ignore[arg-type,return-value]

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(manager, name, getattr(fn, name, None))
    return manager


if TYPE_CHECKING:
    from contextlib import AbstractContextManager as _Manager
