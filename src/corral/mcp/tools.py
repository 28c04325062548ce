"""The tools ``corral mcp`` offers, as data, and the translation of a call into a session
operation and of its outcome into a reply.  No MCP SDK here, and no I/O of its own: the
session (:mod:`corral.mcp.session`) does the work, the server (:mod:`corral.mcp.server`)
speaks the protocol.

Arguments are checked strictly, with the request's own rules (:mod:`corral.request`): an
unknown argument, a wrong type or a path that could leave the workspace is a
:class:`~corral.errors.UsageError` whose message says what, why and how to fix it; the
server turns it into a tool error.  A tool call never widens the server's policy: a
``timeout_s`` above the server's is lowered to it (:func:`corral.execute.capped`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..api import Result
from ..errors import UsageError
from ..execute import capped
from ..policy import Policy
from ..record import replace
from ..request import (
    LANGUAGES,
    RequestLimits,
    RunRequest,
    check_relative,
    decode_bytes,
    encode_bytes,
    strict_keys,
)
from ..result import RunResult
from .session import Session

__all__ = ["TOOLS", "Tool", "call", "describe"]

REPLY_OUTPUT = 64 << 10  # bytes of stdout and of stderr a reply shows, each (head and tail)
REPLY_CHANGES = 200  # changed files a reply lists
SHELL = "/bin/bash"  # run_command's "command": the base system always has it
# Bytes are text; binary content may come as {"base64": "..."} (corral.request's form).  The
# schemas say "string" only: some clients turn tool schemas into a subset of JSON Schema
# that has no oneOf (and model APIs refuse one at the top level).
BYTES = {"type": "string", "description": "text (UTF-8); for binary content send "
         "{\"base64\": \"...\"} instead"}
TIMEOUT = {"type": "number", "exclusiveMinimum": 0,
           "description": "wall-clock limit in seconds; at most the server's, which it "
           "also is by default"}
PATH = {"type": "string", "description": "relative to the workspace (/work inside), "
        "like data/input.txt; no '..', no absolute path, never through a symbolic link"}


def _need(obj: dict[str, Any], tool: str, *keys: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise UsageError(f"{tool} needs {' and '.join(missing)}",
                         "", f"give {', '.join(repr(k) for k in missing)}")


def _timeout(obj: dict[str, Any], tool: str) -> RequestLimits:
    value = obj.get("timeout_s")
    if value is None:
        return RequestLimits()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{tool}: timeout_s must be a positive number of seconds",
                         f"it is {value!r}", "write it like 30")
    return RequestLimits(timeout_s=float(value))


def _path(value: Any, tool: str, *, empty: bool = False) -> str:
    if empty and value in (None, "", "."):
        return ""
    if isinstance(value, str) and value.startswith("/"):
        raise UsageError(f"{tool}: path {value!r} is absolute",
                         "paths are relative to the session's workspace (/work inside)",
                         f"write {value.removeprefix('/work/').lstrip('/') or 'a name'!r}, "
                         "without the leading /")
    return check_relative(value, f"{tool}: path")


def run_code_request(args: dict[str, Any]) -> RunRequest:
    obj = strict_keys(args, ("language", "code", "stdin", "timeout_s", "files"),
                      "run_code's arguments")
    _need(obj, "run_code", "language", "code")
    data = {k: obj[k] for k in ("language", "code", "stdin", "files") if k in obj}
    return replace(RunRequest.from_json(data), limits=_timeout(obj, "run_code"))


def run_command_request(args: dict[str, Any]) -> RunRequest:
    obj = strict_keys(args, ("argv", "command", "stdin", "timeout_s"), "run_command's arguments")
    if ("argv" in obj) == ("command" in obj):
        raise UsageError("run_command needs exactly one of argv and command",
                         "argv runs as given, command with /bin/bash -c",
                         "give argv: [\"ls\", \"-l\"] or command: \"ls -l | head\"")
    argv, command = obj.get("argv"), obj.get("command")
    if argv is not None and not (isinstance(argv, list) and argv
                                 and all(isinstance(a, str) for a in argv)):
        raise UsageError("run_command: argv must be a non-empty list of strings",
                         f"it is {argv!r}", "write it like [\"ls\", \"-l\"]")
    if command is not None and not isinstance(command, str):
        raise UsageError("run_command: command must be a string", f"it is {command!r}",
                         "or give argv as a list of strings")
    command = argv if argv is not None else [SHELL, "-c", command]
    data = {"command": command, **({"stdin": obj["stdin"]} if "stdin" in obj else {})}
    return replace(RunRequest.from_json(data), limits=_timeout(obj, "run_command"))


def run_code(session: Session, args: dict[str, Any]) -> dict[str, Any]:
    return _ran(session, run_code_request(args))


def run_command(session: Session, args: dict[str, Any]) -> dict[str, Any]:
    return _ran(session, run_command_request(args))


def _ran(session: Session, request: RunRequest) -> dict[str, Any]:
    reply = run_reply(session.run(request))
    reply["timeout_s"] = capped(session.policy, request.limits).limits.timeout_s
    return reply


def read_file(session: Session, args: dict[str, Any]) -> dict[str, Any]:
    obj = strict_keys(args, ("path",), "read_file's arguments")
    _need(obj, "read_file", "path")
    rel = _path(obj["path"], "read_file")
    data = session.read(rel)
    return {"path": rel, "size": len(data), "content": encode_bytes(data)}


def write_file(session: Session, args: dict[str, Any]) -> dict[str, Any]:
    obj = strict_keys(args, ("path", "content"), "write_file's arguments")
    _need(obj, "write_file", "path", "content")
    rel = _path(obj["path"], "write_file")
    return {"path": rel, "size": session.write(rel, decode_bytes(obj["content"],
                                                                  "write_file: content"))}


def list_files(session: Session, args: dict[str, Any]) -> dict[str, Any]:
    obj = strict_keys(args, ("path",), "list_files's arguments")
    rel = _path(obj.get("path"), "list_files", empty=True)
    entries, cut = session.listing(rel)
    return {"path": rel or ".", "entries": [
        {"path": e.path, "type": e.type, **({"size": e.size} if e.size is not None else {})}
        for e in entries], "cut": cut}


def _shown(data: bytes | None) -> tuple[str, bool]:
    """Output as text for the reply: all of it, or its head and tail with a marker."""
    data = data or b""
    if len(data) <= REPLY_OUTPUT:
        return data.decode("utf-8", errors="replace"), False
    half = REPLY_OUTPUT // 2
    marker = f"\n[corral: {len(data)} bytes in all; {len(data) - 2 * half} in the middle " \
             "are not shown]\n"
    return (data[:half].decode("utf-8", errors="replace") + marker
            + data[-half:].decode("utf-8", errors="replace")), True


def _step(result: Result) -> dict[str, Any]:
    out, out_cut = _shown(result.stdout)
    err, err_cut = _shown(result.stderr)
    step: dict[str, Any] = {
        "status": result.status, "exit_code": result.exit_code, "signal": result.signal,
        "stdout": out, "stderr": err, "wall_s": round(result.wall_s, 3),
        "cpu_s": result.cpu_s, "peak_memory_bytes": result.peak_memory_bytes}
    if out_cut or err_cut:
        step["output_cut_for_reply"] = [n for n, c in (("stdout", out_cut), ("stderr", err_cut))
                                        if c]
    if result.truncated:
        step["output_limit_hit"] = True  # the run wrote more than the output limit
    for key in ("denials", "notes", "unenforced_limits"):
        if getattr(result, key):
            step[key] = list(getattr(result, key))
    return step


def run_reply(res: RunResult) -> dict[str, Any]:
    """What a run tool answers; a run that could not start is a UsageError (a tool error).

    One that started and then lost corral's init (status ``error`` with a step) is a reply,
    with ``error`` saying so: what it printed until then may still help."""
    steps_ran = res.run is not None or res.compile is not None
    if res.status == "invalid" or (res.status == "error" and not steps_ran):
        raise UsageError(res.error or f"the run could not start ({res.status})")
    steps = [s for s in (res.compile, res.run) if s is not None]
    changes = [c for s in steps for c in s.changes]
    reply: dict[str, Any] = {"status": res.status, "ok": res.ok,
                             "exit_code": None if res.run is None else res.run.exit_code}
    if res.run is not None:
        reply.update(_step(res.run))
    if res.compile is not None:
        reply["compile"] = _step(res.compile)
    if res.error:
        reply["error"] = res.error
    reply["files_changed"] = [
        {k: v for k, v in (("path", c.path), ("change", c.change), ("type", c.type),
                           ("size", c.size)) if v is not None}
        for c in changes[:REPLY_CHANGES]]
    if len(changes) > REPLY_CHANGES or any(s.changes_truncated for s in steps):
        reply["files_changed_cut"] = True
    return reply


class Tool(NamedTuple):
    """One tool: what the agent reads about it, its arguments' schema, and its handler."""

    description: str
    schema: dict[str, Any]
    handler: Callable[[Session, dict[str, Any]], dict[str, Any]]
    read_only: bool = False


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": properties}


TOOLS: dict[str, Tool] = {
    "run_code": Tool(
        "Run a program in a fresh sandbox in this session's workspace (/work, the only "
        "writable path besides a private /tmp) and return its exit code, status, stdout, "
        "stderr, the files it changed, and its wall time, CPU time and peak memory. The code "
        "is written to main.py, main.js, main.sh, main.c or main.cpp in the workspace "
        "(replacing a file of that name); c and cpp are compiled there first. files are "
        "written into the workspace before the run. Nothing started survives the run.",
        _object(["language", "code"], language={"enum": list(LANGUAGES)},
                code={"type": "string"}, stdin=BYTES, timeout_s=TIMEOUT,
                files={"type": "object", "additionalProperties": BYTES,
                       "description": "relative path -> content, written first"}),
        run_code),
    "run_command": Tool(
        "Run a command in a fresh sandbox in this session's workspace (/work): argv as "
        "given, or command with /bin/bash -c (exactly one of the two). Returns what run_code "
        "returns.",
        _object([], argv={"type": "array", "minItems": 1, "items": {"type": "string"},
                          "description": "the program and its arguments; or give command"},
                command={"type": "string", "description": "a shell command line; or give "
                         "argv"}, stdin=BYTES, timeout_s=TIMEOUT),
        run_command),
    "read_file": Tool(
        "Read a regular file of this session's workspace (at most 1 MiB): text, or "
        "{\"base64\": ...} when it is not UTF-8.", _object(["path"], path=PATH), read_file,
        read_only=True),
    "write_file": Tool(
        "Write a file into this session's workspace, creating its directories and replacing a "
        "regular file of that name.", _object(["path", "content"], path=PATH, content=BYTES),
        write_file),
    "list_files": Tool(
        "List this session's workspace, or a directory of it: every entry beneath it, with "
        "its type and size (at most 1000 entries).", _object([], path=PATH), list_files,
        read_only=True),
}


def describe(policy: Policy) -> str:
    """The server's policy in one paragraph, for the agent: what every tool call runs under."""
    lim = policy.limits
    parts = [f"timeout {lim.timeout_s:g} s" if lim.timeout_s else "no timeout"]
    if lim.memory_bytes:
        parts.append(f"memory {lim.memory_bytes >> 20} MiB")
    if lim.pids:
        parts.append(f"{lim.pids} processes")
    if lim.disk_bytes:
        parts.append(f"workspace {lim.disk_bytes >> 20} MiB in all")
    net = policy.network.allow
    network = f"network only to {', '.join(net)}" if net else "no network"
    return (f"corral sandbox ({policy.name} profile): each session has its own workspace, "
            f"kept across its calls and removed when the session ends; {network}; limits: "
            f"{', '.join(parts)}.")


def call(session: Session, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
    """Run tool ``name`` with ``args`` in ``session``; UsageError for anything refused."""
    tool = TOOLS.get(name)
    if tool is None:
        raise UsageError(f"unknown tool {name!r}", f"the tools are {', '.join(TOOLS)}", "")
    return tool.handler(session, args or {})
