"""The HTTP service, as a plain ASGI application (served by uvicorn, ``corral[serve]``).

Routes:

=====================  =======================================================================
``POST /run_code``     SandboxFusion's request and response (:mod:`corral.serve.fusion`)
``POST /run_code/batch`` a JSON list of those requests; a list of responses, in order
``POST /v1/runs``      corral's own RunRequest; its RunResult (docs/requests.md)
``GET /healthz``       ``{"ok": true}``; the only route that needs no token
``GET /metrics``       runs, failures, statuses, queue depth, latency percentiles
=====================  =======================================================================

Bound to loopback, a request must name a loopback host (``Host``) and, when a browser sent it,
come from a loopback page (``Origin``): otherwise any web page the user visits could post to
the server, blindly (CSRF with a ``text/plain`` body) or reading the answers (DNS rebinding).
``--allow-host NAME`` adds a name (a reverse proxy's).

Every request is parsed and checked before it is admitted; a bad one is a 400 with a
``{"error": reason}`` body.  Admission counts runs: at most ``workers`` run at once and at most
``queue`` more wait; beyond that a 429 with ``Retry-After``, and nothing runs.  Runs go to a
pool of ``workers`` threads, each calling the one launcher.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engines.local import run_safely
from ..errors import UsageError
from ..httpauth import CHALLENGE, REFUSED, authorized, is_loopback
from ..request import RunRequest, parse_json
from ..result import RunResult
from .config import Config, cap_request
from .fusion import fusion_response, request_from_fusion
from .metrics import Metrics

__all__ = ["App"]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Reply = tuple[int, Any]
RETRY_AFTER_S = 1


class HTTPError(Exception):
    def __init__(self, status: int, reason: str, headers: tuple[tuple[bytes, bytes], ...] = ()
                 ) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


class Hold:
    """What one request holds of the server's ``--max-pending`` bytes, from the first byte of
    its body read to the last byte of its answer sent.  Bodies are what a client controls:
    without a bound, hundreds of them waiting to be read or run (each ~3x its size once
    parsed) outgrow the machine's memory."""

    def __init__(self, app: App) -> None:
        self.app, self.bytes, self.reserved = app, 0, 0

    def take(self, size: int, *, refuse: bool = True, reserve: bool = False) -> None:
        """Count ``size`` more bytes (within what was reserved for the body, if any); over
        the budget: 429, unless ``refuse`` is off (an answer must go out)."""
        if not reserve and self.reserved:
            used = min(size, self.reserved)
            self.reserved -= used
            size -= used
        if refuse and size and self.app.held + size > self.app.config.max_pending:
            self.app.metrics.rejected += 1
            raise HTTPError(429, "the server holds as many request bytes as it may "
                            "(--max-pending): try again shortly",
                            ((b"retry-after", str(RETRY_AFTER_S).encode()),))
        self.app.held += size
        self.bytes += size
        if reserve:
            self.reserved += size

    def release(self) -> None:
        self.app.held -= self.bytes
        self.bytes = self.reserved = 0


class App:
    """One server's state: its configuration, its pool, its admission count, its metrics."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.in_flight = 0
        self.held = 0  # bytes of bodies and answers held now (--max-pending)
        self.pool: ThreadPoolExecutor | None = None
        self.routes: dict[tuple[str, str], Callable[[Any], Awaitable[Reply]]] = {
            ("POST", "/run_code"): self.run_code, ("POST", "/run_code/batch"): self.run_batch,
            ("POST", "/v1/runs"): self.v1_runs, ("GET", "/healthz"): self.healthz,
            ("GET", "/metrics"): self.metrics_json,
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.pool = ThreadPoolExecutor(self.config.workers, thread_name_prefix="serve")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                pool, self.pool = self.pool, None
                if pool is not None:  # the runs in progress finish, and are reaped
                    await asyncio.get_running_loop().run_in_executor(
                        None, functools.partial(pool.shutdown, wait=True, cancel_futures=True))
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        hold = Hold(self)
        try:
            await self._answer(scope, receive, send, hold)
        finally:
            hold.release()

    async def _answer(self, scope: dict[str, Any], receive: Receive, send: Send, hold: Hold
                      ) -> None:
        headers: tuple[tuple[bytes, bytes], ...] = ()
        try:
            route = self.routes.get((scope["method"], scope["path"]))
            if route is None:
                known = any(path == scope["path"] for _, path in self.routes)
                raise HTTPError(405 if known else 404,
                                "method not allowed" if known else "no such route")
            self._check_host(scope)
            if scope["path"] != "/healthz":
                self._authorize(scope)
            # Parsed here, and each route drops what it parsed once it holds its requests: a
            # request waiting for its turn keeps its own bytes only, not two more copies.
            status, body = await route(self._json(await self._body(scope, receive, hold))
                                       if scope["method"] == "POST" else None)
        except HTTPError as e:
            status, body, headers = e.status, {"error": e.reason}, e.headers
            if e.status == 400:
                self.metrics.bad += 1
        except Exception as e:  # a bug in corral: one line for the client and the log
            reason = " ".join(f"corral failed: {type(e).__name__}: {e}".split())[:500]
            print(f"corral: serve: error: {scope['path']}: {reason}", file=sys.stderr,
                  flush=True)
            status, body = 500, {"error": f"{reason}; this is a bug in corral, please report it"}
        data = json.dumps(body).encode()
        hold.take(len(data), refuse=False)  # the run is done: its answer is always sent
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            *headers]})
        await send({"type": "http.response.body", "body": data})

    def _check_host(self, scope: dict[str, Any]) -> None:
        """Bound to loopback: refuse what a browser sends from another site (DNS rebinding
        gives a foreign Host; a cross-site post carries the page's Origin)."""
        if not is_loopback(self.config.host):
            return  # a token is required there, and no page can send it
        names = {"127.0.0.1", "localhost", "::1", self.config.host, *self.config.allow_hosts}
        headers = dict(scope["headers"])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in names:
            raise HTTPError(421, f"the Host {host!r} is not this server's; it answers "
                            "127.0.0.1, localhost and names given with --allow-host")
        origin = headers.get(b"origin")
        if origin is not None and _origin_name(origin.decode("latin-1")) not in names:
            raise HTTPError(403, "requests from web pages of other sites are refused "
                            "(Origin); call the server from a program, not a browser")

    def _authorize(self, scope: dict[str, Any]) -> None:
        token = self.config.token
        if token is None:
            return
        if not authorized(scope["headers"], token):
            raise HTTPError(401, REFUSED, CHALLENGE)

    async def _body(self, scope: dict[str, Any], receive: Receive, hold: Hold) -> bytes:
        """The request's body, counted against ``--max-pending`` as it comes.  Refused, it is
        still read (and dropped): a client still sending would see its connection reset,
        not the answer; past ``--max-body`` the answer comes at once, as before."""
        refused: HTTPError | None = None
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) <= self.config.max_body:
            refused = self._hold(hold, int(declared), reserve=True)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            self._check_size(size)
            if refused is None:
                refused = self._hold(hold, len(chunk))
                chunks.append(chunk)
                if refused is not None:
                    chunks.clear()
            if not message.get("more_body"):
                if refused is not None:
                    raise refused
                return b"".join(chunks)

    @staticmethod
    def _hold(hold: Hold, size: int, reserve: bool = False) -> HTTPError | None:
        try:
            hold.take(size, reserve=reserve)
        except HTTPError as e:
            return e
        return None

    def _check_size(self, size: int) -> None:
        if size > self.config.max_body:
            raise HTTPError(413, f"the body is over this server's {self.config.max_body} bytes")

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return parse_json(body)
        except (ValueError, RecursionError) as e:
            raise HTTPError(400, f"the body is not JSON; {e}") from None

    def _parse(self, parse: Callable[[Any], RunRequest], data: Any, clamp: bool) -> RunRequest:
        try:
            return cap_request(parse(data), self.config, clamp=clamp)
        except UsageError as e:
            raise HTTPError(400, str(e)) from None

    async def _run(self, requests: list[RunRequest]) -> list[RunResult]:
        """Admit ``requests`` as one, or refuse them all with a 429; run them in the pool."""
        limit = self.config.workers + self.config.queue
        if len(requests) > limit:
            raise HTTPError(400, f"a batch of {len(requests)} is over this server's {limit}")
        if self.in_flight + len(requests) > limit:
            self.metrics.rejected += len(requests)
            raise HTTPError(429, "the server is busy: its queue is full",
                            ((b"retry-after", str(RETRY_AFTER_S).encode()),))
        self.in_flight += len(requests)
        try:
            return list(await asyncio.gather(*(self._one(r) for r in requests)))
        finally:
            self.in_flight -= len(requests)

    async def _one(self, request: RunRequest) -> RunResult:
        assert self.pool is not None, "the lifespan started the pool"
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(
            self.pool, run_safely, request, self.config.runs_dir, False)
        self.metrics.finished(result.status, result.ok, time.monotonic() - started)
        return result

    async def run_code(self, data: Any) -> Reply:
        request = self._parse(request_from_fusion, data, clamp=True)
        del data
        [result] = await self._run([request])
        return 200, fusion_response(result)

    async def run_batch(self, data: Any) -> Reply:
        if not isinstance(data, list):
            raise HTTPError(400, "the body must be a JSON list of /run_code requests")
        requests = [self._parse(request_from_fusion, item, clamp=True) for item in data]
        del data
        return 200, [fusion_response(r) for r in await self._run(requests)]

    async def v1_runs(self, data: Any) -> Reply:
        request = self._parse(RunRequest.from_json, data, clamp=False)
        del data
        [result] = await self._run([request])
        return 200, result.to_json()

    async def healthz(self, data: Any) -> Reply:
        return 200, {"ok": True}

    async def metrics_json(self, data: Any) -> Reply:
        return 200, {**self.metrics.to_json(self.in_flight, self.config.workers),
                     "pending_bytes": self.held}


def _host_name(value: str) -> str:
    """The name of a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def _origin_name(value: str) -> str | None:
    """The host of an ``Origin`` (``null`` and other schemes have none)."""
    parts = urllib.parse.urlsplit(value.strip())
    return parts.hostname if parts.scheme in ("http", "https") else None
