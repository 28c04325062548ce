"""Loopback servers and a host-side bridge for egress tests.  Never any other address."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import os
import select
import socket
import textwrap
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.egress.bridge import Bridge
from corral.egress.session import Session


class Handler(http.server.BaseHTTPRequestHandler):
    """``/size/N`` answers N bytes; anything else echoes the request line and Host."""

    protocol_version = "HTTP/1.1"
    server: Origin

    def do_GET(self) -> None:
        self.server.requests.append((self.command, self.path, self.headers.get("Host")))
        if self.path.startswith("/size/"):
            size = int(self.path.removeprefix("/size/"))
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * min(size, 1 << 20)
            while size > 0:
                self.wfile.write(chunk[:size])
                size -= len(chunk)
            return
        body = f"{self.command} {self.path} host={self.headers.get('Host')}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(length)
        self.server.requests.append((self.command, self.path, self.headers.get("Host")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Origin(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that counts the connections it accepts."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler] = Handler) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.connections = 0
        self.requests: list[tuple[str, str, str | None]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        self.connections += 1
        return super().get_request()

    def __enter__(self) -> Origin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class HostBridge:
    """The real bridge code on the host's 127.0.0.1, in a thread, for proxy tests."""

    def __init__(self, session: Session) -> None:
        self.bridge = Bridge({"fd": os.dup(session.bridge.fd or -1), "port": 0})
        self.stop_r, self.stop_w = os.pipe()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return self.bridge.port

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self.bridge.listener.fileno(), select.POLLIN)
        poller.register(self.stop_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self.stop_r:
                    return
                while self.bridge.forward():
                    pass

    def __enter__(self) -> HostBridge:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        os.write(self.stop_w, b"x")
        self.thread.join()
        self.bridge.close()
        os.close(self.stop_r)
        os.close(self.stop_w)


def exchange(port: int, data: bytes, timeout: float = 30.0, trickle: bool = False) -> bytes:
    """Send ``data`` to the bridge (``trickle``: one byte per TCP segment), half-close, and
    read everything until the proxy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            if trickle:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for i in range(len(data)):
                    sock.send(data[i:i + 1])
            else:
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def write_script(who: Any, name: str, text: str) -> Path:
    """``text`` (dedented) in a file of ``who``'s temp directory that the sandbox can read."""
    path = who.tmp / name
    path.write_text(textwrap.dedent(text))
    who.chown(path)
    path.chmod(0o644)
    return path


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


@contextlib.contextmanager
def settled_fds() -> Iterator[set[int]]:
    """The descriptors open before the block; the caller compares after."""
    yield open_fds()


def build_wheel(dest: Path, name: str = "corraltiny", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: one module whose VALUE is 42."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: corral-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def package_index(root: Path) -> Path:
    """A PEP 503 simple index under ``root`` serving one tiny wheel."""
    files = root / "files"
    files.mkdir(parents=True)
    wheel = build_wheel(files)
    project = root / "simple" / "corraltiny"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<a href="../../files/{wheel.name}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}'
        f'">{wheel.name}</a>\n')
    return root


class StaticHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class StaticOrigin(Origin):
    """Serves the files under ``root`` on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(StaticHandler, directory=str(root))
        super().__init__(handler)  # type: ignore[arg-type]
