"""The bearer token of corral's HTTP servers (``corral serve``, ``corral mcp --transport
http``): one scheme for both, from the option to the refusal.

* Where it comes from: ``--token-file FILE`` (a regular file, owned by the server's user or
  root, that no other user may read or write), else ``$CORRAL_TOKEN``.  A set but empty
  variable is an error, never "no token": an empty ``$(cat missing)`` must not open the
  server.  The variable is removed from corral's own environment once read.
* What it is: at least ``MIN_TOKEN`` visible ASCII characters (surrounding white space, a
  file's newline, is dropped); anything else could not travel in a header unchanged.
* When it is required: bound to any address but loopback (an IP literal that is loopback, or
  ``localhost``); a host name that resolves elsewhere, ``0.0.0.0`` and ``::`` all need one.
* How clients send it: ``Authorization: Bearer TOKEN`` (the scheme in any case, RFC 9110);
  compared in constant time, whatever the length sent.  A refusal is 401 with
  ``WWW-Authenticate: Bearer`` and one JSON line saying what to send.

Pure but for :func:`read_token` (which reads the file and the environment).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import os
import stat
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .errors import UsageError

__all__ = ["ENV", "MIN_TOKEN", "REFUSED", "RequireToken", "add_argument", "authorized",
           "challenge", "is_loopback", "read_token", "required"]

ENV = "CORRAL_TOKEN"
OLD_ENV = "CORRAL_MCP_TOKEN"  # corral mcp's own name, before the two servers shared one
MIN_TOKEN = 16
MAX_FILE = 4096  # bytes read from a token file: a token is far shorter
REFUSED = "a valid token is required: send Authorization: Bearer TOKEN"
CHALLENGE = ((b"www-authenticate", b"Bearer"),)


def add_argument(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The ``--token-file`` option, worded the same for every server."""
    parser.add_argument("--token-file", metavar="FILE", help=f"{prefix}clients must send "
                        f"'Authorization: Bearer TOKEN' with the token in FILE (only its "
                        f"owner may read it), or in ${ENV}; needed off loopback")


def is_loopback(host: str) -> bool:
    """``host`` (as given to bind) is a loopback address: ``localhost`` or a literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: wherever it resolves, it is not known to be loopback


def read_token(path: str | None, environ: MutableMapping[str, str] | None = None
               ) -> str | None:
    """The raw token from ``path`` or the environment (None: neither gives one)."""
    env = os.environ if environ is None else environ
    if OLD_ENV in env:
        raise UsageError(f"${OLD_ENV} is no longer read", "corral serve and corral mcp "
                         "share one token variable now", f"rename it to ${ENV}")
    value = env.pop(ENV, None)  # no child of corral's inherits it
    if path is not None:
        return _read_file(path)
    if value is not None and not value.strip():
        raise UsageError(f"${ENV} is set but empty", "an empty token would leave the server "
                         "open", f"put the token in it, or unset {ENV}")
    return value


def _read_file(path: str) -> str:
    try:
        # O_NONBLOCK: a FIFO at the path must not hang the start; O_NOFOLLOW: the file
        # checked is the file read.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"cannot read --token-file {path}", e.strerror or str(e),
                         "give the path of a file holding the token") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"--token-file {path} is not a regular file", "a token is read "
                             "from a plain file", "give the path of a file holding the token")
        if st.st_mode & 0o077:
            raise UsageError(f"other users may read or change --token-file {path}",
                             "whoever reads it can run code through this server",
                             f"chmod 600 {path}")
        if st.st_uid not in (os.geteuid(), 0):
            raise UsageError(f"--token-file {path} belongs to another user",
                             "its owner could change the token to one they know",
                             "use a file of your own")
        return f.read(MAX_FILE).decode("utf-8", errors="replace")


def required(token: str | None, host: str, server: str) -> str | None:
    """The token clients must send, checked; UsageError when it is unusable, or missing
    where one is needed (``host`` not loopback).  ``server`` names it in the error."""
    if token is None:
        if not is_loopback(host):
            raise UsageError(f"{server} on {host} needs a token", "anyone who can reach the "
                             "address could run code on this machine", "pass --token-file "
                             f"FILE or set ${ENV} (or bind 127.0.0.1)")
        return None
    token = token.strip()
    if len(token) < MIN_TOKEN or not all("!" <= c <= "~" for c in token):
        raise UsageError("the token is too short or not plain text", f"a token is at least "
                         f"{MIN_TOKEN} visible ASCII characters, no spaces",
                         "make one with: openssl rand -hex 32")
    return token


def authorized(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """The request's headers carry exactly one ``Authorization: Bearer <token>``."""
    given = [value for name, value in headers if name.lower() == b"authorization"]
    if len(given) != 1:
        return False
    scheme, _, credentials = given[0].strip().partition(b" ")
    ok = hmac.compare_digest(hashlib.sha256(credentials.strip()).digest(),
                             hashlib.sha256(token.encode()).digest())
    return ok and scheme.lower() == b"bearer"


def challenge() -> tuple[int, tuple[tuple[bytes, bytes], ...], bytes]:
    """The refusal: status, headers, body."""
    return 401, CHALLENGE, json.dumps({"error": REFUSED}).encode()


Send = Callable[[dict[str, Any]], Awaitable[None]]


class RequireToken:
    """ASGI wrapper: every HTTP request but those to ``open_paths`` must carry the token."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str,
                 open_paths: tuple[str, ...] = ()) -> None:
        self.app, self.token, self.open_paths = app, token, open_paths

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] not in self.open_paths
                and not authorized(scope["headers"], self.token)):
            status, headers, body = challenge()
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), *headers]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
