"""HTTP/1.x request heads for the proxy: parsed strictly, checked, rewritten.  Pure.

Two request shapes are accepted, everything else is refused with a status
and a one-line reason:

* ``CONNECT host:port`` (authority form): a tunnel, for HTTPS and anything
  else; a ``Host`` header, if sent, must name the same host (and port).
* ``GET http://host[:port]/path`` (absolute form), plain HTTP: the ``Host``
  header must agree with the URI.  Exactly one request is forwarded per
  client connection, with ``Connection: close``, so a second request on the
  same connection can never reach a destination that was not checked.  Its
  body must have a ``Content-Length``: chunked request bodies are refused
  (411), which leaves nothing to smuggle past the end of the body.

The parser is strict on purpose (CRLF line ends, token names, no obsolete
line folding, no control characters, one ``Content-Length``): a proxy and an
origin that read one message two ways is how requests get smuggled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .rules import Code, parse_host, parse_port, split_host_port

__all__ = ["BadRequest", "HeadReader", "Request", "deny_response", "parse_request",
           "upstream_head"]

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_BODY = 1 << 40
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET_BAD = re.compile(r"[\x00-\x20\x7f-\xff]")
# ASCII digits only: str.isdigit() and int() also take '¹', '٣' and a sign.
_LENGTH = re.compile(r"[0-9]{1,13}\Z")
# Hop-by-hop headers, never forwarded (RFC 9110, 7.6.1), plus the proxy's own.
HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization",
                        "proxy-authenticate", "te", "trailer", "transfer-encoding", "upgrade"})
# Headers that frame or route the message: a Connection header that names one asks the proxy
# to drop it, and the origin would then read the body as a second request.  Refused.
END_TO_END = frozenset({"host", "content-length", "transfer-encoding", "expect"})
REASONS = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
           505: "HTTP Version Not Supported"}


class BadRequest(Exception):
    """A request the proxy refuses before any rule is consulted."""

    def __init__(self, status: int, reason: str, code: Code = Code.BAD_REQUEST) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class Request:
    """A checked request head.  ``host`` is as written; rules normalise it."""

    method: str
    host: str
    port: int
    path: str  # origin form for plain HTTP; empty for CONNECT
    version: str
    headers: tuple[tuple[str, str], ...]
    body_length: int = 0

    @property
    def tunnel(self) -> bool:
        return self.method == "CONNECT"


class HeadReader:
    """Collects a request head as it arrives, scanning each byte once.

    A client that sends its head one byte at a time must not make the proxy
    re-copy and re-scan everything received so far for every byte.
    """

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, chunk: bytes) -> tuple[bytes, bytes] | None:
        """(head, bytes after it) once the head is complete, else None; BadRequest if too big."""
        start = max(0, len(self.data) - 3)  # the end marker may straddle two chunks
        self.data += chunk
        end = self.data.find(b"\r\n\r\n", start, MAX_HEAD + 4)
        if end >= 0:
            return bytes(self.data[:end + 4]), bytes(self.data[end + 4:])
        if len(self.data) > MAX_HEAD:
            raise BadRequest(431, "the request head is over 64 KiB")
        return None


def _lines(head: bytes) -> list[str]:
    if len(head) > MAX_HEAD:
        raise BadRequest(431, "the request head is over 64 KiB")
    text = head.decode("latin-1")
    if not text.endswith("\r\n\r\n"):
        raise BadRequest(400, "the request head does not end with an empty line")
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise BadRequest(400, "the request has a bare CR or LF; lines end with CRLF")
    return lines


def _headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    if len(lines) > MAX_HEADERS:
        raise BadRequest(431, f"the request has over {MAX_HEADERS} header lines")
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name):
            raise BadRequest(400, "a header line is not NAME: VALUE (obsolete folding too)")
        value = value.strip(" \t")
        if _VALUE_BAD.search(value):
            raise BadRequest(400, f"header {name} has a control character")
        headers.append((name, value))
    return tuple(headers)


def _one(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    values = [v for k, v in headers if k.lower() == name]
    if len(values) > 1:
        raise BadRequest(400, f"the request has {len(values)} {name} headers")
    return values[0] if values else None


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    try:
        host, port = split_host_port(text)
        if not host:
            raise ValueError("has no host")
        if port is None:
            if default_port is None:
                raise ValueError("has no port")
            return host, default_port
        return host, parse_port(port)
    except ValueError as e:
        raise BadRequest(400, f"target {text[:80]!r} {e}", Code.BAD_TARGET) from None


def _same_host(header: str, host: str, port: int, default_port: int | None) -> bool:
    """Whether a Host header names ``host:port``; names compare in normal form."""
    try:
        h_host, h_port = split_host_port(header)
        same = parse_host(h_host) == parse_host(host)
    except ValueError:
        return False
    if h_port is None:
        return same and (default_port is None or port == default_port)
    try:
        return same and parse_port(h_port) == port
    except ValueError:
        return False


def _absolute(target: str) -> tuple[str, int, str]:
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise BadRequest(400, "the request target is not an absolute URI; "
                              "send http://host/path to a proxy, or CONNECT host:port")
    if scheme.lower() != "http":
        raise BadRequest(400, f"{scheme}:// cannot be proxied as plain HTTP; use CONNECT")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise BadRequest(400, "the URI carries user information; it is refused",
                         Code.BAD_TARGET)
    if "#" in path:
        raise BadRequest(400, "the URI has a fragment")
    host, port = _authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def parse_request(head: bytes) -> Request:
    """Parse and check one request head (ending in CRLF CRLF); raises BadRequest."""
    lines = _lines(head)
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or _TARGET_BAD.search(parts[1]):
        raise BadRequest(400, "the request line is not METHOD TARGET VERSION")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, f"{version[:20]!r} is not HTTP/1.0 or HTTP/1.1")
    headers = _headers(lines[1:])
    host_header = _one(headers, "host")
    length_text = _one(headers, "content-length")
    if method == "CONNECT":
        host, port = _authority(target, None)
        path, default_port = "", None
    else:
        host, port, path = _absolute(target)
        default_port = 80
    if host_header is not None and not _same_host(host_header, host, port, default_port):
        raise BadRequest(403, f"the Host header {host_header[:80]!r} disagrees with the "
                              f"request target {target[:80]!r}", Code.BAD_REQUEST)
    if any(k.lower() == "transfer-encoding" for k, _ in headers):
        raise BadRequest(411, "chunked request bodies are not forwarded; "
                              "send a Content-Length, or use HTTPS (CONNECT)")
    _check_connection(headers)
    body = 0
    if length_text is not None:
        if not _LENGTH.match(length_text) or int(length_text) > MAX_BODY:
            raise BadRequest(400, "Content-Length is not a plain number")
        body = int(length_text)
        if method == "CONNECT" and body:
            raise BadRequest(400, "a CONNECT request has no body")
    return Request(method, host, port, path, version, headers, body)


def _connection_names(headers: tuple[tuple[str, str], ...]) -> set[str]:
    return {t.strip().lower() for k, v in headers if k.lower() == "connection"
            for t in v.split(",")}


def _check_connection(headers: tuple[tuple[str, str], ...]) -> None:
    named = sorted(_connection_names(headers) & END_TO_END)
    if named:
        raise BadRequest(400, f"the Connection header names {named[0]}, which is not "
                              "hop-by-hop; it is refused, not dropped")


def upstream_head(req: Request, host: str) -> bytes:
    """The head forwarded to the origin: origin form, hop-by-hop headers gone, close.

    Host and Content-Length always go through (:func:`parse_request` refused a
    Connection header that names them), so the origin frames the body exactly
    as the proxy forwards it.
    """
    named = _connection_names(req.headers) - END_TO_END
    lines = [f"{req.method} {req.path} HTTP/1.1"]
    if not any(k.lower() == "host" for k, _ in req.headers):
        lines.append(f"Host: {host}" + ("" if req.port == 80 else f":{req.port}"))
    lines += [f"{k}: {v}" for k, v in req.headers
              if k.lower() not in HOP_BY_HOP and k.lower() not in named]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def deny_response(status: int, code: str, reason: str) -> bytes:
    """A short plain-text response; the reason is in the body and in X-Corral-Reason."""
    safe = reason.encode("ascii", "backslashreplace").decode("ascii")
    safe = re.sub(r"[\x00-\x1f\x7f]", " ", safe)[:300]
    body = f"corral: {safe}\n".encode("ascii")
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"X-Corral-Denied: {code}\r\n"
            f"X-Corral-Reason: {safe}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + body
