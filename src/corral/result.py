"""What a :class:`~corral.request.RunRequest` gave back: :class:`RunResult`, in a stable JSON form.

A request runs at most two sandboxed steps (a compile step for c and cpp, then the run);
each has its own :class:`~corral.api.Result`.  ``status`` sums them up in one word:

========================  ==================================================================
``exited``, ``signaled``  the run ended by itself (see ``run.exit_code``, ``run.signal``)
``timeout``, ``oom``      corral ended the run at a limit (wall clock or CPU time; memory)
``output-limit``          the run wrote more than the output cap
``disk-limit``            the run added more than the disk limit to its workspace
``compile-failed``        the compile step did not succeed (see ``compile``); nothing ran
``invalid``               the request was refused before anything started (``error`` says why)
``error``                 the sandbox could not be set up here, or corral's init died after
                          the command started (``error`` says why)
========================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import Result
from .errors import UsageError
from .record import field_names
from .request import (
    Fetched,
    decode_bytes,
    encode_bytes,
    fetched_from_json,
    fetched_json,
    strict_keys,
)
from .workspace import Change

__all__ = ["STATUSES", "RunResult", "result_from_json", "result_to_json"]

STATUSES = ("exited", "signaled", "timeout", "oom", "output-limit", "disk-limit",
            "compile-failed", "invalid", "error")
RESULT_KEYS = field_names(Result)


def result_to_json(result: Result) -> dict[str, Any]:
    """``corral run --json``'s object, with output encoded losslessly (see corral.request)."""
    out = result.to_json()
    for name in ("stdout", "stderr"):
        data = getattr(result, name)
        out[name] = None if data is None else encode_bytes(data)
    return out


def _change(data: Any) -> Change:
    obj = strict_keys(data, Change._fields, "a change")
    try:
        return Change(**obj)
    except TypeError as e:
        raise UsageError("a change is incomplete", str(e), "") from None


# Field -> how its JSON value becomes the field's value; every other field is taken as is,
# lists becoming tuples.
_CONVERT: dict[str, Any] = {
    "stdout": lambda v: None if v is None else decode_bytes(v, "stdout"),
    "stderr": lambda v: None if v is None else decode_bytes(v, "stderr"),
    "changes": lambda v: tuple(_change(c) for c in v),
    "denials": lambda v: tuple(v),
}
_TYPES: dict[str, tuple[type, ...]] = {
    "exit_code": (int,), "status": (str,), "signal": (int, type(None)),
    "wall_s": (int, float), "cpu_s": (int, float, type(None)),
    "peak_memory_bytes": (int, type(None)), "truncated": (bool,), "workspace": (str,),
    "record": (str,), "run_id": (str,), "changes_truncated": (bool,),
}


def result_from_json(data: Any, where: str = "a result") -> Result:
    """The inverse of :func:`result_to_json`; UsageError when a key is unknown or malformed."""
    obj = strict_keys(data, RESULT_KEYS, where)
    args: dict[str, Any] = {}
    for key, value in obj.items():
        kinds = _TYPES.get(key)
        if kinds is not None and (not isinstance(value, kinds) or
                                  (isinstance(value, bool) and bool not in kinds)):
            raise UsageError(f"{where}: {key} has the wrong type", f"it is {value!r}", "")
        if key in _CONVERT:
            if key in ("changes", "denials") and not isinstance(value, list):
                raise UsageError(f"{where}: {key} must be a list", f"it is {value!r}", "")
            value = _CONVERT[key](value)
        elif isinstance(value, list):
            value = tuple(value)
        args[key] = value
    try:
        return Result(**args)
    except TypeError as e:
        raise UsageError(f"{where} is incomplete", str(e), "give every key") from None


@dataclass(frozen=True, slots=True)
class RunResult:
    """The result of one request: its steps' Results, the fetched files, and one status."""

    id: str | None
    status: str  # one of STATUSES
    run: Result | None = None
    compile: Result | None = None
    files: tuple[Fetched, ...] = ()
    error: str | None = None  # invalid, error: the reason, one line
    node: str | None = None  # where it ran, when an engine says (Ray: the node id)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise UsageError(f"result status {self.status!r} is not known",
                             f"known: {', '.join(STATUSES)}", "")

    @property
    def ok(self) -> bool:
        """The run ended by itself with exit status 0."""
        return self.status == "exited" and self.run is not None and self.run.exit_code == 0

    @classmethod
    def refused(cls, request_id: str | None, status: str, reason: str) -> RunResult:
        """A request that never started: ``invalid`` input or a sandbox ``error``."""
        return cls(request_id, status, error=reason)

    def to_json(self) -> dict[str, Any]:
        got, missed = fetched_json(self.files)
        out: dict[str, Any] = {
            "id": self.id, "status": self.status, "ok": self.ok,
            "exit_code": None if self.run is None else self.run.exit_code,
            "run": None if self.run is None else result_to_json(self.run),
            "compile": None if self.compile is None else result_to_json(self.compile),
            "files": got, "unfetched": missed, "error": self.error, "node": self.node,
        }
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunResult:
        obj = strict_keys(data, JSON_KEYS, "a run result")
        for key in ("id", "error", "node"):
            if not isinstance(obj.get(key), str | type(None)):
                raise UsageError(f"a run result: {key} must be a string or null", "", "")
        if not isinstance(obj.get("status"), str):
            raise UsageError("a run result needs a status", "", "")
        steps = {k: None if obj.get(k) is None else result_from_json(obj[k], f"result {k}")
                 for k in ("run", "compile")}
        got, missed = obj.get("files", {}), obj.get("unfetched", {})
        if not isinstance(got, dict) or not isinstance(missed, dict):
            raise UsageError("a run result: files and unfetched must be objects", "", "")
        return cls(obj.get("id"), obj["status"], steps["run"], steps["compile"],
                   fetched_from_json(got, missed), obj.get("error"), obj.get("node"))


# ok and exit_code are derived from the rest: written for readers, ignored when read back.
JSON_KEYS = ("id", "status", "ok", "exit_code", "run", "compile", "files", "unfetched", "error",
             "node")
