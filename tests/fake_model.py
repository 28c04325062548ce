"""A fake model server on 127.0.0.1 that speaks each agent's API, for the real-agent tests.

It answers the Anthropic Messages API (``/v1/messages``, streaming or not), the OpenAI
Responses API (``/v1/responses``) and Chat Completions (``/v1/chat/completions``), and
Gemini's ``generateContent`` and ``streamGenerateContent``.  Its script is an agent loop:
each request that offers a shell tool is answered with a call of that tool running the
next of :attr:`FakeModel.commands` (the tool result that comes back is kept); once they
have all run, with the text ``DONE``.  A command given as ``(NAME, ARGUMENTS)`` calls the
tool NAME instead (an MCP server's, like ``mcp__corral__run_code``; Codex offers those in a
Responses API namespace, ``mcp__corral`` holding ``run_code``, and they are named here as
Claude Code names them), once a request offers it.  Requests without the tool (titles) get
``DONE`` too, and Gemini CLI's own JSON checks a value of the schema they ask for.  Every
request body is kept, so a test can check what the model saw, and the tool names each
request offered.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Tool names the agents give their shell tool, and how each one takes the command.
SHELL_TOOLS = ("Bash", "bash", "shell", "shell_command", "exec_command", "run_shell_command",
               "local_shell")


class FakeModel:
    """The server; use as a context manager.  ``port`` is where it listens."""

    def __init__(self, *commands: str | tuple[str, dict[str, Any]]) -> None:
        self.commands = commands  # one tool call each, in turn
        self.offered: list[list[str]] = []  # the tool names each request offered
        self.requests: list[dict[str, Any]] = []  # {"path": ..., "body": ...}
        self.tool_calls = 0
        self.tool_results: list[str] = []
        # Called with each tool result as it arrives, while the agent waits for the answer
        # (its tools, an MCP server's session say, still running).
        self.on_result: Callable[[str], None] | None = None
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seen(self) -> str:
        """Everything every request carried, as one string."""
        with self.lock:
            return "\n".join(json.dumps(r) for r in self.requests)

    def paths(self) -> list[str]:
        with self.lock:
            return [r["path"] for r in self.requests]

    # -- the script -------------------------------------------------------------

    def decide(self, tools: list[tuple[str, dict[str, Any]]], result: str | None
               ) -> tuple[str, dict[str, Any]] | None:
        """The tool call to make (name, arguments), or None to answer with text."""
        with self.lock:
            if result is not None:
                self.tool_results.append(result)
                if self.on_result is not None:
                    self.on_result(result)
            self.offered.append([n for n, _ in tools])
            if self.tool_calls >= len(self.commands):
                return None
            command = self.commands[self.tool_calls]
            named = command[0] if isinstance(command, tuple) else None
            tool = next(((n, s) for n, s in tools
                         if (n == named if named else n in SHELL_TOOLS)), None)
            if tool is None:
                return None
            self.tool_calls += 1
        if isinstance(command, tuple):
            return command[0], dict(command[1])
        name, schema = tool
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        if "cmd" in props:
            args: dict[str, Any] = {"cmd": command}
        elif props.get("command", {}).get("type") == "array":
            args = {"command": ["bash", "-lc", command]}
        else:
            args = {"command": command}
        if "description" in props:
            args["description"] = "run the test command"
        return name, args


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# -- per-API parsing and answers ----------------------------------------------------

def _anthropic(model: FakeModel, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    tools = [(t.get("name", ""), t.get("input_schema", {})) for t in body.get("tools", [])]
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content") if last.get("role") == "user" else None
    results = [c for c in content or [] if isinstance(c, dict) and c.get("type") == "tool_result"]
    call = model.decide(tools, _text_of(results[-1].get("content")) if results else None)
    message = {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
               "model": body.get("model", "fake"), "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": message}
    if call is None:
        yield "content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}
        yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "text_delta", "text": "DONE"}}
    else:
        yield "content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "tool_use", "name": call[0],
                                                        "id": f"toolu_{uuid.uuid4().hex[:12]}",
                                                        "input": {}}}
        yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "input_json_delta",
                                                "partial_json": json.dumps(call[1])}}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": "end_turn" if call is None else "tool_use",
                                      "stop_sequence": None}, "usage": {"output_tokens": 5}}
    yield "message_stop", {"type": "message_stop"}


def _anthropic_whole(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The same answer as one JSON message (``"stream": false``)."""
    message = dict(events[0][1]["message"])
    block = dict(events[1][1]["content_block"])
    delta = events[2][1]["delta"]
    if block["type"] == "text":
        block["text"] = delta["text"]
    else:
        block["input"] = json.loads(delta["partial_json"])
    message.update(content=[block], stop_reason=events[4][1]["delta"]["stop_reason"])
    return message


def _responses_tools(body: dict[str, Any]
                     ) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, tuple[str, str]]]:
    """The tools offered, a namespace's as ``NAMESPACE__TOOL``; and those names' parts."""
    tools, spaced = [], {}
    for t in body.get("tools", []):
        if not isinstance(t, dict):
            continue
        if t.get("type") == "namespace":
            for inner in t.get("tools", []):
                full = f"{t.get('name', '')}__{inner.get('name', '')}"
                tools.append((full, inner.get("parameters", {})))
                spaced[full] = (t.get("name", ""), inner.get("name", ""))
        tools.append((t.get("name", ""), t.get("parameters", {})))
    return tools, spaced


def _responses(model: FakeModel, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    tools, spaced = _responses_tools(body)
    items = body.get("input") if isinstance(body.get("input"), list) else []
    outputs = [i for i in items if isinstance(i, dict) and i.get("type", "").endswith("_output")]
    last_is_result = bool(items) and items[-1] in outputs
    call = model.decide(tools, _text_of(outputs[-1].get("output")) if last_is_result else None)
    rid = f"resp_{uuid.uuid4().hex[:12]}"
    yield "response.created", {"type": "response.created", "response": {"id": rid}}
    if call is None:
        item: dict[str, Any] = {"type": "message", "role": "assistant", "id": f"msg_{rid}",
                                "content": [{"type": "output_text", "text": "DONE",
                                             "annotations": []}]}
    else:
        item = {"type": "function_call", "id": f"fc_{rid}", "call_id": f"call_{rid}",
                "name": call[0], "arguments": json.dumps(call[1])}
        if call[0] in spaced:
            item["namespace"], item["name"] = spaced[call[0]]
    yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                        "item": item}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 15}
    yield "response.completed", {"type": "response.completed",
                                 "response": {"id": rid, "output": [item], "usage": usage}}


def _chat(model: FakeModel, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    tools = [(t.get("function", {}).get("name", ""), t.get("function", {}).get("parameters", {}))
             for t in body.get("tools", []) if isinstance(t, dict)]
    messages = body.get("messages") or [{}]
    last = messages[-1]
    call = model.decide(tools, _text_of(last.get("content")) if last.get("role") == "tool"
                        else None)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": 0, "model": body.get("model", "fake")}
    if call is None:
        delta: dict[str, Any] = {"role": "assistant", "content": "DONE"}
    else:
        delta = {"role": "assistant", "tool_calls": [{
            "index": 0, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": call[0], "arguments": json.dumps(call[1])}}]}
    yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    yield {**base, "choices": [{"index": 0, "delta": {},
                                "finish_reason": "stop" if call is None else "tool_calls"}],
           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def _gemini(model: FakeModel, body: dict[str, Any]) -> dict[str, Any]:
    tools = [(f.get("name", ""), f.get("parameters") or f.get("parametersJsonSchema") or {})
             for t in body.get("tools", []) for f in t.get("functionDeclarations", [])]
    last = (body.get("contents") or [{}])[-1]
    answers = [p["functionResponse"] for p in last.get("parts", []) if "functionResponse" in p]
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    if schema:  # Gemini CLI's own checks (routing, next speaker) want JSON of a shape
        part: dict[str, Any] = {"text": json.dumps(_sample(schema))}
    else:
        call = model.decide(tools, _text_of(answers[-1].get("response")) if answers else None)
        part = {"text": "DONE"} if call is None else {
            "functionCall": {"name": call[0], "args": call[1]}}
    return {"candidates": [{"content": {"role": "model", "parts": [part]},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                              "totalTokenCount": 15}, "modelVersion": "fake"}


def _sample(schema: dict[str, Any]) -> Any:
    """A value of the JSON schema: the first enum value, 10 for numbers, "ok" for text."""
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        return {k: _sample(v) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return []
    return {"integer": 10, "number": 10, "boolean": False}.get(kind, "ok")


# -- HTTP -------------------------------------------------------------------------------

def _handler(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            self._record(None)
            self._json(404, {"error": {"message": "not here", "type": "not_found_error"}})

        def do_HEAD(self) -> None:
            self._record(None)
            self._json(200, {})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"raw": raw.decode(errors="replace")}
            self._record(body)
            path = self.path.split("?")[0]
            if path.endswith("/messages/count_tokens"):
                self._json(200, {"input_tokens": 10})
            elif path.endswith("/messages"):
                events = list(_anthropic(model, body))
                if body.get("stream"):
                    self._sse(f"event: {name}\ndata: {json.dumps(data)}\n\n"
                              for name, data in events)
                else:
                    self._json(200, _anthropic_whole(events))
            elif path.endswith("/responses"):
                self._sse(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in
                          _responses(model, body))
            elif path.endswith("/chat/completions"):
                self._sse([*(f"data: {json.dumps(c)}\n\n" for c in _chat(model, body)),
                           "data: [DONE]\n\n"])
            elif ":streamGenerateContent" in path:
                self._sse([f"data: {json.dumps(_gemini(model, body))}\n\n"])
            elif ":generateContent" in path:
                self._json(200, _gemini(model, body))
            elif ":countTokens" in path:
                self._json(200, {"totalTokens": 10})
            else:
                self._json(404, {"error": {"message": f"no {path} here"}})

        def _record(self, body: Any) -> None:
            with model.lock:
                model.requests.append({"path": self.path, "method": self.command,
                                       "headers": dict(self.headers), "body": body})

        def _json(self, code: int, data: Any) -> None:
            payload = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True

        def _sse(self, chunks: Any) -> None:
            payload = "".join(chunks).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True

    return Handler
