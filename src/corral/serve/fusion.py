"""SandboxFusion's ``/run_code`` request and response, translated to corral's and back.

Field names, types and status strings follow SandboxFusion's own server (``RunCodeRequest``,
``RunCodeResponse``, ``CommandRunResult``), so that a client written for it — a veRL reward
function, a code-evaluation harness — works unchanged against ``corral serve``:

* request: ``code``, ``language``, ``compile_timeout`` and ``run_timeout`` (seconds, default
  10), ``memory_limit_MB`` (-1: the default), ``stdin``, ``files`` (path -> base64, or null to
  skip), ``fetch_files``;
* response: ``status`` ``Success`` | ``Failed`` | ``SandboxError``, ``message``,
  ``compile_result`` and ``run_result`` (``status`` ``Finished`` | ``Error`` |
  ``TimeLimitExceeded``, ``execution_time``, ``return_code``, ``stdout``, ``stderr``),
  ``executor_pod_name``, ``files`` (path -> base64, fetched files that exist).

Two differences, both on purpose: an unknown key is a 400 (SandboxFusion ignores it, so a
misspelt limit would silently not apply), and the languages are corral's (python, nodejs,
bash, c, cpp).
"""

from __future__ import annotations

import base64
import math
from typing import Any

from ..api import Result
from ..errors import UsageError
from ..request import (
    LANGUAGES,
    RequestLimits,
    RunRequest,
    check_relative,
    decode_bytes,
    strict_keys,
    text_of,
)
from ..result import RunResult

__all__ = ["fusion_response", "request_from_fusion"]

KEYS = ("code", "language", "compile_timeout", "run_timeout", "memory_limit_MB", "stdin",
        "files", "fetch_files")
DEFAULT_TIMEOUT_S = 10.0  # SandboxFusion's defaults for both timeouts


def _seconds(value: Any, key: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            or not math.isfinite(value)):
        raise UsageError(f"{key} must be a positive number of seconds", f"it is {value!r}", "")
    return float(value)


def _files(value: Any) -> tuple[tuple[str, bytes], ...]:
    if not isinstance(value, dict):
        raise UsageError("files must be an object of path -> base64", f"it is {value!r}", "")
    out = []
    for path, content in value.items():
        if content is None:  # SandboxFusion skips these
            continue
        if not isinstance(content, str):
            raise UsageError(f"files[{path!r}] must be base64 text or null", "", "")
        out.append((check_relative(path, "files entry"),
                    decode_bytes({"base64": content}, f"files[{path!r}]")))
    return tuple(out)


def request_from_fusion(data: Any) -> RunRequest:
    """A RunRequest from a ``/run_code`` body; UsageError naming what is wrong."""
    obj = strict_keys(data, KEYS, "the request")
    code, language = obj.get("code"), obj.get("language")
    if not isinstance(code, str):
        raise UsageError("code is required and must be a string", "", "")
    if language not in LANGUAGES:
        raise UsageError(f"language {language!r} is not supported here",
                         f"corral runs: {', '.join(LANGUAGES)}", "pick one of those")
    memory = obj.get("memory_limit_MB", -1)
    if isinstance(memory, bool) or not isinstance(memory, int):
        raise UsageError("memory_limit_MB must be an integer", f"it is {memory!r}", "")
    stdin = obj.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise UsageError("stdin must be a string or null", f"it is {stdin!r}", "")
    fetch = obj.get("fetch_files", [])
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise UsageError("fetch_files must be a list of paths", f"it is {fetch!r}", "")
    limits = RequestLimits(
        timeout_s=_seconds(obj.get("run_timeout", DEFAULT_TIMEOUT_S), "run_timeout"),
        compile_timeout_s=_seconds(obj.get("compile_timeout", DEFAULT_TIMEOUT_S),
                                   "compile_timeout"),
        memory_bytes=memory << 20 if memory > 0 else None)
    return RunRequest(code=text_of(code, "code"), language=language,
                      stdin=None if stdin is None else decode_bytes(stdin, "stdin"),
                      files=_files(obj.get("files", {})), fetch=tuple(fetch), limits=limits)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _step(result: Result | None) -> dict[str, Any] | None:
    if result is None:
        return None
    limit = result.status == "timeout"
    return {"status": "TimeLimitExceeded" if limit else "Finished",
            "execution_time": round(result.wall_s, 6),
            "return_code": None if limit else result.exit_code,
            "stdout": _text(result.stdout), "stderr": _text(result.stderr)}


def fusion_response(result: RunResult) -> dict[str, Any]:
    """The ``/run_code`` response for ``result``."""
    if result.status in ("error", "invalid"):
        status, message = "SandboxError", result.error or ""
    else:
        status, message = ("Success" if result.ok else "Failed"), ""
    files = {f.path: base64.b64encode(f.content).decode("ascii")
             for f in result.files if f.content is not None}
    return {"status": status, "message": message, "compile_result": _step(result.compile),
            "run_result": _step(result.run), "executor_pod_name": None, "files": files}
