"""Record classes for the run path: what ``@dataclass(slots=True)`` (frozen or not) gave the
policy, sandbox and outcome types, without importing :mod:`dataclasses` (issue 12).

``import dataclasses`` brings inspect, ast, dis and tokenize with it, and each dataclass
writes and compiles its methods when it is defined: measured with callgrind, ~70 M
instructions for the import and ~2.5 M for each class, against ~0.07 M for a subclass of
:class:`Record`, at every ``corral run``.  What is kept: fields with defaults and
``field(default_factory=..., repr=False)``, positional and keyword construction with the
same TypeErrors for a missing or unknown argument, ``__post_init__``, equality between
instances of the same class, ``frozen=True`` (assignment raises :class:`FrozenInstanceError`,
an AttributeError as in dataclasses) with a hash of the fields, a repr, ``__match_args__``,
pickling.  Not kept: ``__slots__`` (instances have a ``__dict__``), ordering, ``InitVar``,
``kw_only``, inheritance of fields from a non-Record.  mypy treats subclasses as
dataclasses (``dataclass_transform``), so their constructors stay checked.

:func:`replace` and :func:`field_names` stand for ``dataclasses.replace`` and
``dataclasses.fields``; ``replace`` hands anything that is not a Record to dataclasses.
"""

from __future__ import annotations

# typing itself costs ~3 ms of every start (callgrind: ~11.5 M instructions for the CLI):
# corral's run path imports it only for mypy, which takes TYPE_CHECKING as true
# (pyproject.toml's always_true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar, dataclass_transform

    T = TypeVar("T")
else:
    def dataclass_transform(**_: object) -> Callable[[type], type]:  # typing's, for mypy
        return lambda cls: cls

__all__ = ["FrozenInstanceError", "NamedTuple", "Record", "field", "field_names", "replace"]

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """A field of a frozen record was assigned or deleted."""


class _Field:
    __slots__ = ("default", "factory", "repr")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, repr: bool) -> None:
        self.default, self.factory, self.repr = default, factory, repr


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None,
          repr: bool = True) -> Any:
    """A field's default made per instance (``default_factory``), or a field left out of
    the repr; as dataclasses.field, for these two uses only."""
    return _Field(default, default_factory, repr)


@dataclass_transform(field_specifiers=(field,))
class Record:
    """Base of a record class: annotated class attributes are its fields, in order.

    ``class Limits(Record, frozen=True): timeout_s: float | None = 300.0``
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _shown: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}
    _factories: ClassVar[dict[str, Callable[[], Any]]] = {}

    def __init_subclass__(cls, frozen: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names, hidden = list(cls._fields), set(cls._fields) - set(cls._shown)
        defaults, factories = dict(cls._defaults), dict(cls._factories)
        # not inspect.get_annotations: importing inspect is what this module saves
        for name, note in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
            if "ClassVar" in str(note):
                continue
            if name not in names:
                names.append(name)
            value = cls.__dict__.get(name, _MISSING)
            if isinstance(value, _Field):
                if not value.repr:
                    hidden.add(name)
                if value.factory is not None:
                    factories[name] = value.factory
                value = value.default
                if value is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, value)
            if value is not _MISSING:
                defaults[name] = value
            elif name not in factories and (defaults or factories):
                raise TypeError(f"non-default argument {name!r} follows default argument")
        cls._fields = tuple(names)
        setattr(cls, "__match_args__", cls._fields)  # noqa: B010  (mypy: not declared here)
        cls._shown = tuple(n for n in names if n not in hidden)
        cls._defaults, cls._factories = defaults, factories
        if frozen:
            cls.__setattr__ = _frozen_setattr  # type: ignore[method-assign,assignment]
            cls.__delattr__ = _frozen_delattr  # type: ignore[method-assign,assignment]
            cls.__hash__ = _hash  # type: ignore[method-assign,assignment]
        else:
            cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared: unhashable

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        names = cls._fields
        if len(args) > len(names):
            raise TypeError(f"{cls.__qualname__}() takes {len(names)} positional arguments "
                            f"but {len(args)} were given")
        values = self.__dict__
        values.update(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in values or name not in names:
                how = "multiple values for" if name in values else "an unexpected keyword"
                raise TypeError(f"{cls.__qualname__}() got {how} argument {name!r}")
            values[name] = value
        if len(values) < len(names):
            for name in names:
                if name in values:
                    continue
                if name in cls._factories:
                    values[name] = cls._factories[name]()
                elif name in cls._defaults:
                    values[name] = cls._defaults[name]
                else:
                    raise TypeError(f"{cls.__qualname__}() missing required argument: "
                                    f"{name!r}")
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    def _values(self) -> tuple[Any, ...]:
        values = self.__dict__
        return tuple(values[n] for n in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        values = self.__dict__
        shown = ", ".join(f"{n}={values[n]!r}" for n in self._shown)
        return f"{type(self).__qualname__}({shown})"


def _frozen_setattr(self: Record, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Record, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _hash(self: Record) -> int:
    return hash(self._values())


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of ``obj`` with ``changes``, through its constructor (``__post_init__`` runs)."""
    if not isinstance(obj, Record):
        import dataclasses

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    values = obj.__dict__
    return type(obj)(**{**{n: values[n] for n in obj._fields}, **changes})


def field_names(kind: type[Record] | Record) -> tuple[str, ...]:
    """The fields' names, in order (``[f.name for f in dataclasses.fields(kind)]``)."""
    return kind._fields


# typing.NamedTuple, minus the evaluation of each field's annotation (with postponed
# annotations every field's string becomes a ForwardRef, compiled once: callgrind, ~1.1 M
# instructions for a class of 3 fields) and minus collections.namedtuple's compile of a
# __new__ for each class (~0.34 M a class; 37 such classes load at every corral run).
# The class made is a tuple subclass with what namedtuple gives it (fields by name,
# _fields, _field_defaults, _make, _replace, _asdict, the repr, __match_args__,
# pickling), the body's methods, docstring and qualified name; one __new__ of plain
# Python binds the arguments for every class.  mypy sees typing.NamedTuple.
if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    _PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                             "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})

    class _NamedTupleMeta(type):
        def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
            if not bases:  # NamedTuple itself
                return super().__new__(mcs, name, bases, ns)
            if bases != (NamedTuple,):
                raise TypeError("corral.record.NamedTuple takes no other base")
            names = list(ns.get("__annotations__", {}))
            defaults = [ns[n] for n in names if n in ns]
            if any(n not in ns for n in names[len(names) - len(defaults):]):
                raise TypeError(f"{name}: a field without a default follows one with")
            made = _tuple_class(name, tuple(names), tuple(defaults), ns["__module__"])
            made.__annotations__ = dict(ns.get("__annotations__", {}))
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
                if key not in _SPECIAL and key not in names:
                    setattr(made, key, value)
            return made

    class NamedTuple(metaclass=_NamedTupleMeta):
        pass

    def _tuple_class(name: str, names: tuple[str, ...], defaults: tuple[Any, ...],
                     module: str) -> type:
        # The C item getter, from where collections itself takes it: importing the
        # collections package costs ~9 M instructions (corral.small says why that matters).
        from _collections import _tuplegetter  # type: ignore[import-not-found]

        first_default = len(names) - len(defaults)
        index = {n: i for i, n in enumerate(names)}

        def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
            if not kwargs and first_default <= len(args) <= len(names):  # the usual call
                return tuple.__new__(cls, args + defaults[len(args) - first_default:])
            if len(args) > len(names):
                raise TypeError(f"{name}() takes {len(names)} positional arguments but "
                                f"{len(args)} were given")
            values = [*args, *defaults[len(args) - first_default:]] \
                if len(args) >= first_default else [*args, *([_MISSING] * (
                    first_default - len(args))), *defaults]
            for key, value in kwargs.items():
                at = index.get(key)
                if at is None:
                    raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
                if at < len(args):
                    raise TypeError(f"{name}() got multiple values for argument {key!r}")
                values[at] = value
            if any(v is _MISSING for v in values):
                missing = [names[i] for i, v in enumerate(values) if v is _MISSING]
                raise TypeError(f"{name}() missing required arguments: {missing}")
            return tuple.__new__(cls, values)

        def _make(cls: type, iterable: Any) -> Any:
            made = tuple.__new__(cls, iterable)
            if len(made) != len(names):
                raise TypeError(f"Expected {len(names)} arguments, got {len(made)}")
            return made

        def _replace(self: Any, **changes: Any) -> Any:
            made = _make(type(self), map(changes.pop, names, self))
            if changes:
                raise ValueError(f"Got unexpected field names: {list(changes)!r}")
            return made

        def __repr__(self: Any) -> str:
            return f"{type(self).__name__}(" + ", ".join(
                f"{n}={v!r}" for n, v in zip(names, self, strict=True)) + ")"

        def _asdict(self: Any) -> dict[str, Any]:
            return dict(zip(names, self, strict=True))

        def __getnewargs__(self: Any) -> tuple[Any, ...]:
            return tuple(self)

        body: dict[str, Any] = {
            "__slots__": (), "__module__": module, "_fields": names, "__match_args__": names,
            "_field_defaults": dict(zip(names[first_default:], defaults, strict=True)),
            "__new__": __new__, "_make": classmethod(_make), "_replace": _replace,
            "__repr__": __repr__, "_asdict": _asdict, "__getnewargs__": __getnewargs__}
        for i, n in enumerate(names):
            body[n] = _tuplegetter(i, f"Alias for field number {i}")
        return type(name, (tuple,), body)
