"""One serializable request and result for every front end: :class:`RunRequest`, :class:`RunResult`.

A request is frozen data, validated when built, with a stable JSON form
(:meth:`RunRequest.from_json` / :meth:`RunRequest.to_json`); so is its result.  Parsing is
strict: an unknown key, a wrong type or a bad value is a :class:`~corral.errors.UsageError`
whose message names the key, the rule and the fix.  The schema is in ``docs/requests.md``.

Bytes (file contents, stdin, output) travel in JSON as a string when they are valid UTF-8,
otherwise as ``{"base64": "..."}``: lossless, and readable in the common case.

Nothing here touches the machine: :mod:`corral.execute` runs a request.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError
from .policy import Network, check_env_name, parse_duration, parse_size

__all__ = ["LANGUAGES", "PROFILES", "Fetched", "Language", "RequestLimits", "RunRequest",
           "decode_bytes", "encode_bytes", "parse_json", "strict_keys"]

MAX_FILES = 1000  # files placed in the workspace by one request
MAX_FILES_BYTES = 64 << 20  # their contents, in all
MAX_FETCH = 100  # files fetched back
MAX_PATH = 1024  # bytes in one relative path
MAX_ID = 200  # characters in a request id
# Run-mode profiles only: an agent profile would give a request network to a model API and
# lift the run-mode limits, so a request can never name one.
PROFILES = ("python", "node", "shell")


@dataclass(frozen=True, slots=True)
class Language:
    """How code in one language is placed, compiled (inside the sandbox) and run."""

    source: str  # the file the code is written to, in the workspace
    profile: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None


LANGUAGES: dict[str, Language] = {
    "python": Language("main.py", "python", ("python3", "main.py")),
    "nodejs": Language("main.js", "node", ("node", "main.js")),
    "bash": Language("main.sh", "shell", ("/bin/bash", "main.sh")),
    "c": Language("main.c", "shell", ("./main",),
                  ("gcc", "-O2", "-std=gnu17", "-o", "main", "main.c", "-lm")),
    "cpp": Language("main.cpp", "shell", ("./main",),
                    ("g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp", "-lm")),
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(text: bytes | str) -> Any:
    """Standard JSON only: Python's parser also takes ``NaN`` and ``Infinity``, which no
    limit, count or duration may be (``1e999`` is infinite too: numbers are checked finite
    where they are read).  ValueError or RecursionError when it is not JSON."""
    return json.loads(text, parse_constant=_no_constant)


def text_of(value: Any, where: str) -> str:
    """``value`` as a string that is real Unicode text (JSON's ``"\\ud800"`` is a lone
    surrogate: no file name, argument or variable can hold it)."""
    if not isinstance(value, str):
        raise UsageError(f"{where} must be a string", f"it is {value!r}", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{where} is not valid text", "it holds a lone UTF-16 surrogate",
                         "send the characters themselves, or bytes as {\"base64\": ...}"
                         ) from None
    return value


def encode_bytes(data: bytes) -> str | dict[str, str]:
    """Bytes as JSON: the text when it is UTF-8, else ``{"base64": ...}``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def decode_bytes(value: Any, where: str) -> bytes:
    """The inverse of :func:`encode_bytes`; UsageError naming ``where`` when malformed."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogatepass")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError):
            pass
    raise UsageError(f"{where} is not text or {{\"base64\": ...}}",
                     "bytes are a JSON string (UTF-8) or an object with one key, base64",
                     "encode binary content as base64")


def strict_keys(data: Any, known: tuple[str, ...], where: str) -> dict[str, Any]:
    """``data`` as a JSON object holding only ``known`` keys."""
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be a JSON object", f"it is {type(data).__name__}", "")
    for key in data:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            raise UsageError(f"unknown key {key!r} in {where}",
                             f"did you mean {close[0]!r}?" if close
                             else f"known keys: {', '.join(known)}",
                             "fix the key; unknown keys are never ignored")
    return data


def check_relative(path: Any, where: str) -> str:
    """A path beneath the workspace, as the request wrote it: relative, no ``..``, no NUL."""
    if not isinstance(path, str) or not path:
        raise UsageError(f"{where} must be a non-empty string", f"it is {path!r}", "")
    text_of(path, where)
    parts = path.split("/")
    if (path.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or any(c in path for c in "\0\n\r") or len(path.encode(errors="replace")) > MAX_PATH):
        raise UsageError(f"{where} {path!r} is not a plain relative path",
                         "paths are relative to the workspace, without '.', '..', empty parts, "
                         f"NUL or newlines, at most {MAX_PATH} bytes",
                         "write it like data/input.txt")
    return path


_text = text_of


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where} must be a list of strings", f"it is {value!r}", "")
    return tuple(text_of(v, where) for v in value)


def _table(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise UsageError(f"{where} must be an object of strings", f"it is {value!r}", "")
    return tuple((text_of(k, where), text_of(v, where)) for k, v in value.items())


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{where} must be a positive integer", f"it is {value!r}", "")
    return value


def _number(value: Any, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            or not math.isfinite(value)):
        raise UsageError(f"{where} must be a positive, finite number", f"it is {value!r}", "")
    return float(value)


def _duration(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UsageError(f"{where} must be a duration like 10 or \"500ms\"", f"it is {value!r}", "")
    return parse_duration(value, where)


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"{where} must be a size like 536870912 or \"512M\"",
                         f"it is {value!r}", "")
    return parse_size(value, where)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Limits a request asks for; ``None`` keeps the profile's (or the server's) default.

    A request can tighten or loosen a limit within what its front end allows
    (:mod:`corral.serve` caps them), never switch one off.
    """

    timeout_s: float | None = None  # the run's wall clock
    compile_timeout_s: float | None = None  # the compile step's wall clock (c, cpp)
    cpu_s: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None
    output_bytes: int | None = None  # captured stdout and stderr, each
    fetch_bytes: int | None = None  # each fetched file

    def __post_init__(self) -> None:
        for key, (name, check) in LIMIT_KEYS.items():
            value = getattr(self, name)
            if value is not None:
                check(value, f"limits.{key}")

    @classmethod
    def from_json(cls, data: Any) -> RequestLimits:
        obj = strict_keys(data, tuple(LIMIT_KEYS), "limits")
        return cls(**{LIMIT_KEYS[k][0]: LIMIT_KEYS[k][1](v, f"limits.{k}")
                      for k, v in obj.items()})

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, name) for k, (name, _) in LIMIT_KEYS.items()
                if getattr(self, name) is not None}


Check = Callable[[Any, str], Any]
LIMIT_KEYS: dict[str, tuple[str, Check]] = {  # JSON key -> (field, parse and check)
    "timeout": ("timeout_s", _duration), "compile_timeout": ("compile_timeout_s", _duration),
    "cpu": ("cpu_s", _duration), "memory": ("memory_bytes", _size), "pids": ("pids", _count),
    "cpus": ("cpus", _number), "disk": ("disk_bytes", _size), "output": ("output_bytes", _size),
    "fetch": ("fetch_bytes", _size),
}
NETWORK_KEYS = ("allow", "deny", "resolve")


def _network(data: Any) -> Network:
    obj = strict_keys(data, NETWORK_KEYS, "network")
    return Network(allow=_strings(obj.get("allow", []), "network.allow"),
                   deny=_strings(obj.get("deny", []), "network.deny"),
                   resolve=_table(obj.get("resolve", {}), "network.resolve"))


def _files(data: Any) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(data, dict):
        raise UsageError("files must be an object of path -> content", f"it is {data!r}", "")
    return tuple((path, decode_bytes(content, f"files[{path!r}]"))
                 for path, content in data.items())


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One run: a command, or code in a language; what to place, limit, allow and fetch back.

    Exactly one of ``command`` and ``code`` is given; ``code`` needs ``language`` (one of
    :data:`LANGUAGES`).  ``files`` are written into the fresh workspace (``/work``) before
    the run; ``fetch`` names workspace files whose contents come back in the result.
    """

    command: tuple[str, ...] | None = None
    code: str | None = None
    language: str | None = None
    files: tuple[tuple[str, bytes], ...] = ()
    stdin: bytes | None = None
    profile: str | None = None  # one of PROFILES; default: the language's, or by command name
    limits: RequestLimits = field(default_factory=RequestLimits)
    network: Network = field(default_factory=Network)
    env: tuple[tuple[str, str], ...] = ()
    fetch: tuple[str, ...] = ()
    id: str | None = None

    def __post_init__(self) -> None:
        self._check_payload()
        if self.profile is not None and self.profile not in PROFILES:
            raise UsageError(f"profile {self.profile!r} cannot be requested",
                             f"requests run under a run-mode profile: {', '.join(PROFILES)}",
                             "pick one of those, or leave it out")
        self._check_files()
        for name, value in self.env:
            check_env_name(name)
            text_of(value, f"env {name}")
            if "\0" in value:
                raise UsageError(f"env {name} contains NUL", "", "remove the NUL byte")
        if len(self.fetch) > MAX_FETCH:
            raise UsageError(f"fetch names {len(self.fetch)} files", f"at most {MAX_FETCH}",
                             "fetch fewer files, or an archive of them")
        for path in self.fetch:
            check_relative(path, "fetch entry")
        if self.id is not None:
            text_of(self.id, "id")
        if self.id is not None and (not self.id or len(self.id) > MAX_ID
                                    or not self.id.isprintable()):
            raise UsageError(f"id {self.id[:MAX_ID]!r} is not usable",
                             f"ids are 1 to {MAX_ID} printable characters", "fix the id")

    def _check_payload(self) -> None:
        if (self.command is None) == (self.code is None):
            raise UsageError("a request needs exactly one of command and code",
                             "it runs either an argv or a program in a language",
                             "give \"command\": [...] or \"code\" with \"language\"")
        if self.command is not None and (not self.command or any("\0" in a for a in self.command)):
            raise UsageError("command must be a non-empty list without NUL bytes", "",
                             "write it like [\"python3\", \"main.py\"]")
        for arg in self.command or ():
            text_of(arg, "command")
        if self.code is not None and self.language not in LANGUAGES:
            raise UsageError(f"language {self.language!r} is not supported",
                             f"supported: {', '.join(LANGUAGES)}", "pick one of those")
        if self.command is not None and self.language is not None:
            raise UsageError("language goes with code, not with command", "",
                             "drop language, or give code instead of command")

    def _check_files(self) -> None:
        if len(self.files) > MAX_FILES:
            raise UsageError(f"the request places {len(self.files)} files",
                             f"at most {MAX_FILES}", "send an archive and unpack it in the run")
        total = sum(len(content) for _, content in self.files)
        if total > MAX_FILES_BYTES:
            raise UsageError(f"the request's files hold {total} bytes",
                             f"at most {MAX_FILES_BYTES} in all", "send less")
        paths = [check_relative(path, "files entry") for path, _ in self.files]
        source = LANGUAGES[self.language].source if self.code is not None and self.language \
            else None
        for i, path in enumerate(paths):
            clash = next((p for p in paths[:i] if p == path or path.startswith(p + "/")
                          or p.startswith(path + "/")), None)
            if clash is not None or path == source:
                raise UsageError(f"files entry {path!r} collides with "
                                 f"{clash or 'the code, written to ' + path!r}",
                                 "each path is placed once, as a file", "rename one of them")

    @property
    def language_spec(self) -> Language | None:
        return LANGUAGES[self.language] if self.code is not None and self.language else None

    @classmethod
    def from_json(cls, data: Any) -> RunRequest:
        """A request from its JSON object (already parsed); UsageError saying what is wrong."""
        obj = strict_keys(data, REQUEST_KEYS, "the request")
        args: dict[str, Any] = {}
        for key, value in obj.items():
            if value is not None:
                args[key] = REQUEST_FIELDS[key](value)
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "command": list(self.command) if self.command is not None else None,
            "code": self.code, "language": self.language,
            "files": {p: encode_bytes(c) for p, c in self.files},
            "stdin": None if self.stdin is None else encode_bytes(self.stdin),
            "profile": self.profile, "limits": self.limits.to_json(),
            "network": {"allow": list(self.network.allow), "deny": list(self.network.deny),
                        "resolve": dict(self.network.resolve)},
            "env": dict(self.env), "fetch": list(self.fetch),
        }
        return {k: v for k, v in out.items() if v not in (None, {}, [])
                and not (k == "network" and not any(v.values()))}


REQUEST_FIELDS: dict[str, Callable[[Any], Any]] = {
    "id": lambda v: _text(v, "id"),
    "command": lambda v: _strings(v, "command"),
    "code": lambda v: _text(v, "code"),
    "language": lambda v: _text(v, "language"),
    "files": _files,
    "stdin": lambda v: decode_bytes(v, "stdin"),
    "profile": lambda v: _text(v, "profile"),
    "limits": RequestLimits.from_json,
    "network": _network,
    "env": lambda v: _table(v, "env"),
    "fetch": lambda v: _strings(v, "fetch"),
}
REQUEST_KEYS = tuple(REQUEST_FIELDS)


@dataclass(frozen=True, slots=True)
class Fetched:
    """One file the request asked back: its contents, or why there are none."""

    path: str
    content: bytes | None
    reason: str | None = None  # missing, not a regular file, over the cap, a link on the way


def fetched_json(files: tuple[Fetched, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """``files`` (path -> content) and ``unfetched`` (path -> reason) of the JSON form."""
    got = {f.path: encode_bytes(f.content) for f in files if f.content is not None}
    missed = {f.path: f.reason or "not fetched" for f in files if f.content is None}
    return got, missed


def fetched_from_json(got: Mapping[str, Any], missed: Mapping[str, Any]) -> tuple[Fetched, ...]:
    out = [Fetched(check_relative(p, "files entry"), decode_bytes(c, f"files[{p!r}]"))
           for p, c in got.items()]
    out += [Fetched(check_relative(p, "unfetched entry"), None, _text(r, f"unfetched[{p!r}]"))
            for p, r in missed.items()]
    return tuple(out)
