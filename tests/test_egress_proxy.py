"""The egress proxy in this process, reached through the real bridge code on 127.0.0.1.

Every server here listens on 127.0.0.1 and every name is pinned to it, or is
``localhost`` (found in /etc/hosts): the resolver used refuses any other
name, so no test can send a DNS query.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Identity
from corral.egress.rules import IPAddress
from corral.egress.session import Session, open_session
from corral.policy import Network
from egress_util import HostBridge, Origin, exchange, open_fds
from netns_util import run_in_netns


def local_resolver(name: str, port: int) -> Sequence[IPAddress]:
    """``localhost`` only, as /etc/hosts has it; any other lookup fails the test."""
    assert name == "localhost", f"the proxy tried to resolve {name!r}"
    return [ipaddress.ip_address("127.0.0.1")]


@contextlib.contextmanager
def proxy(tmp_path: Path, allow: tuple[str, ...], deny: tuple[str, ...] = (),
          pins: tuple[tuple[str, str], ...] = (), resolver=local_resolver,  # type: ignore[no-untyped-def]
          ) -> Iterator[tuple[Session, int]]:
    tmp_path.mkdir(exist_ok=True)
    session = open_session(Network(allow=allow, deny=deny, resolve=pins), str(tmp_path),
                           resolver=resolver)
    assert isinstance(session, Session)
    with session, HostBridge(session) as bridge:
        yield session, bridge.port


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else -1


def log_lines(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "egress.jsonl").read_text().splitlines()]


def socks_request(host: bytes, port: int, kind: int = 3, command: int = 1) -> bytes:
    addr = bytes((len(host),)) + host if kind == 3 else host
    return b"\x05\x01\x00" + bytes((5, command, 0, kind)) + addr + port.to_bytes(2, "big")


def test_connect_plain_http_and_socks_reach_a_pinned_origin(tmp_path: Path) -> None:
    with Origin() as origin, proxy(tmp_path, ("origin.test",),
                                   pins=(("origin.test", "127.0.0.1"),)) as (session, port):
        target = f"origin.test:{origin.port}".encode()
        plain = exchange(port, b"GET http://" + target + b"/a?b HTTP/1.1\r\nHost: " + target +
                         b"\r\nProxy-Connection: keep-alive\r\n\r\n")
        assert status(plain) == 200 and plain.endswith(b"GET /a?b host=" + target + b"\n")
        tunnel = exchange(port, b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target +
                          b"\r\n\r\nGET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200")
        assert tunnel.endswith(b"GET /t host=x\n")
        over_socks = exchange(port, socks_request(b"origin.test", origin.port) +
                              b"GET /s HTTP/1.1\r\nHost: y\r\nConnection: close\r\n\r\n")
        assert over_socks[:2] == b"\x05\x00" and over_socks[2:4] == b"\x05\x00"
        assert over_socks.endswith(b"GET /s host=y\n")
        assert origin.connections == 3 and session.denials() == ()
    lines = log_lines(tmp_path)
    assert [(x["protocol"], x["allowed"], x["address"]) for x in lines] == [
        ("http", True, "127.0.0.1"), ("http-connect", True, "127.0.0.1"),
        ("socks5", True, "127.0.0.1")]


def test_denials_are_403_with_a_reason_logged_and_listed(tmp_path: Path) -> None:
    with Origin() as origin, proxy(tmp_path, ("*.test",), deny=("secret.test",),
                                   pins=(("secret.test", "127.0.0.1"),)) as (session, port):
        denied = exchange(port, f"CONNECT secret.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
        head, _, body = denied.partition(b"\r\n\r\n")
        assert status(denied) == 403 and b"X-Corral-Denied: denied" in head
        assert body == f"corral: secret.test:{origin.port} is denied by rule " \
                       f"secret.test\n".encode()
        other = exchange(port, b"GET http://example.com/ HTTP/1.1\r\n\r\n")
        assert status(other) == 403 and b"not in the allow list" in other
        bind = exchange(port, socks_request(b"\x7f\x00\x00\x01", 80, kind=1, command=2))
        assert bind == b"\x05\x00\x05\x07\x00\x01" + bytes(6)  # command not supported
        udp = exchange(port, socks_request(b"a.test", 53, command=3))
        assert udp[2:4] == b"\x05\x07"
        assert origin.connections == 0
        codes = [d["code"] for d in session.denials()]
    assert codes == ["denied", "not-allowed", "bad-request", "bad-request"]
    assert [x["code"] for x in log_lines(tmp_path)] == codes


LOOPBACK_SPELLINGS = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0x7f.0.0.1",
                      "0177.0.0.1", "127.0.0.1.", "[::ffff:127.0.0.1]", "[::1]",
                      "[::ffff:7f00:1]", "[0:0:0:0:0:ffff:127.0.0.1]", "localhost"]


def test_loopback_in_any_spelling_never_reaches_an_unpinned_server(tmp_path: Path) -> None:
    with Origin() as canary, proxy(tmp_path, ("localhost", "*.test")) as (session, port):
        for host in LOOPBACK_SPELLINGS:
            target = f"{host}:{canary.port}".encode()
            for request in (b"CONNECT " + target + b" HTTP/1.1\r\n\r\n",
                            b"GET http://" + target + b"/ HTTP/1.1\r\n\r\n"):
                assert status(exchange(port, request)) in (400, 403), (host, request)
            name = host.strip("[]").encode()
            assert exchange(port, socks_request(name, canary.port))[2:4] in (
                b"\x05\x02", b"\x05\x08"), host
        for packed in (b"\x7f\x00\x00\x01", ipaddress.IPv6Address("::1").packed,
                       ipaddress.IPv6Address("::ffff:127.0.0.1").packed):
            kind = 1 if len(packed) == 4 else 4
            assert exchange(port, socks_request(packed, canary.port, kind))[2:4] == b"\x05\x02"
        assert canary.connections == 0
        reasons = {d["code"] for d in session.denials()}
        assert reasons == {"ip-literal", "bad-target", "blocked-address"}
        localhost = [d for d in session.denials() if d["host"] == "localhost"]
        assert localhost and all("a loopback address" in str(d["reason"]) for d in localhost)
    # Negative controls: the canary is reachable once loopback is named on purpose.
    with Origin() as canary, proxy(tmp_path / "listed", ("127.0.0.1",)) as (_, port):
        assert status(exchange(port, f"GET http://127.0.0.1:{canary.port}/ HTTP/1.1\r\n\r\n"
                               .encode())) == 200
        assert canary.connections == 1
    with Origin() as canary, proxy(tmp_path / "pinned", ("localhost",),
                                   pins=(("localhost", "127.0.0.1"),)) as (_, port):
        assert status(exchange(port, f"CONNECT localhost:{canary.port} HTTP/1.1\r\n\r\n"
                               .encode())) == 200
        assert canary.connections == 1


def test_host_header_must_agree_with_the_target(tmp_path: Path) -> None:
    pins = (("origin.test", "127.0.0.1"), ("other.test", "127.0.0.1"))
    with Origin() as origin, proxy(tmp_path, ("origin.test", "other.test"),
                                   pins=pins) as (session, port):
        assert session.denials() == ()
        for request in (f"CONNECT origin.test:{origin.port} HTTP/1.1\r\nHost: evil.test\r\n\r\n",
                        f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n"
                        f"Host: other.test:{origin.port}\r\n\r\n"):
            response = exchange(port, request.encode())
            assert status(response) == 403 and b"disagrees" in response
        assert origin.connections == 0
        # Control: the same requests with an agreeing Host header go through.
        ok = exchange(port, f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n"
                            f"Host: ORIGIN.test.:{origin.port}\r\n\r\n".encode())
        assert status(ok) == 200 and origin.connections == 1


def test_plain_http_forwards_one_request_and_exactly_its_body(tmp_path: Path) -> None:
    with Origin() as origin, proxy(tmp_path, ("origin.test",),
                                   pins=(("origin.test", "127.0.0.1"),)) as (_, port):
        t = f"origin.test:{origin.port}"
        smuggled = "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"
        response = exchange(port, (f"POST http://{t}/p HTTP/1.1\r\nHost: {t}\r\n"
                                   f"Content-Length: 5\r\n\r\nhello" + smuggled).encode())
        assert status(response) == 200 and response.endswith(b"\r\n\r\nhello")
        assert origin.requests == [("POST", "/p", t)]


def test_a_name_is_resolved_once_and_the_checked_address_is_used(tmp_path: Path) -> None:
    calls: list[str] = []

    def resolver(name: str, port: int) -> Sequence[IPAddress]:
        calls.append(name)
        return local_resolver(name, port)

    with Origin() as canary, proxy(tmp_path, ("localhost",), resolver=resolver) as (_, port):
        response = exchange(port, f"CONNECT localhost:{canary.port} HTTP/1.1\r\n\r\n".encode())
        assert status(response) == 403 and calls == ["localhost"]
        exchange(port, b"CONNECT unlisted.test:443 HTTP/1.1\r\n\r\n")
        assert calls == ["localhost"], "a refused name must never reach the resolver"


DIGITS = st.sampled_from(["\u00b2", "\u00b9", "\u0663", "\uff11", "+1", "-1", "1_0", "0x1",
                          "8" * 14, "80", ""])
HOP_NAMES = st.sampled_from(["content-length", "host", "transfer-encoding", "expect", "x-a",
                             "keep-alive", "close", "te, content-length", "Host, x-a"])
HOSTILE = st.one_of(
    st.binary(max_size=400),
    st.builds(lambda m, h, p, tail: f"{m} {h}:{p} HTTP/1.1\r\n".encode() + tail,
              st.sampled_from(["CONNECT", "GET", "POST", "connect", "CONNECT\t"]),
              st.sampled_from([*LOOPBACK_SPELLINGS, "origin.test", "evil.test", "", "[", "a" * 300,
                               "origin.test\x00.evil", "http://origin.test", "ORIGIN.TEST."]),
              st.one_of(st.integers(-1, 70000), st.just("CANARY"), st.text(max_size=6), DIGITS),
              st.binary(max_size=200)),
    st.builds(lambda kind, data: b"\x05\x01\x00\x05" + data[:1] + b"\x00" + bytes((kind,)) +
              data[1:], st.integers(0, 255), st.binary(max_size=64)),
    st.builds(lambda head: head + b"\r\n\r\n", st.binary(max_size=300)),
    # Unicode and signed numbers in the Host port and Content-Length, hop-by-hop names in
    # Connection: each must be one answer and one log line, never a crash.
    st.builds(lambda port, length, named, enc: (
        f"POST http://origin.test:CANARY/ HTTP/1.1\r\nHost: origin.test:{port}\r\n"
        f"Connection: {named}\r\nContent-Length: {length}\r\n\r\nbody").encode(enc, "replace"),
        DIGITS, DIGITS, HOP_NAMES, st.sampled_from(["latin-1", "utf-8"])),
)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.lists(st.tuples(HOSTILE, st.booleans()), min_size=1, max_size=4))
def test_fuzzed_hostile_requests(fuzz_proxy: dict[str, object],
                                 data: list[tuple[bytes, bool]]) -> None:
    """Every request that sent a byte gets an answer and a log line, whole or a byte at a
    time; none reaches the canary."""
    port, canary, session = fuzz_proxy["port"], fuzz_proxy["canary"], fuzz_proxy["session"]
    assert isinstance(port, int) and isinstance(canary, Origin) and isinstance(session, Session)
    assert session.log is not None
    for raw, trickle in data:
        raw = raw.replace(b"CANARY", str(canary.port).encode())
        lines = session.log.lines
        response = exchange(port, raw, timeout=60, trickle=trickle)
        assert response.startswith((b"HTTP/1.1 ", b"\x05", b"\x00")) if raw else True
        if raw:
            assert session.log.lines > lines, raw  # logged before it was answered
    assert canary.connections == 0


@pytest.fixture(scope="module")
def fuzz_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """One proxy for every fuzzed example; afterwards it must still serve, and hold nothing.

    origin.test is pinned to 127.0.0.1 but allowed on the origin's port only,
    so no request may ever reach the canary, whatever it says.
    """
    tmp = tmp_path_factory.mktemp("fuzz")
    before = open_fds()
    with Origin() as canary, Origin() as origin:
        pins = (("origin.test", "127.0.0.1"),)
        allow = (f"origin.test:{origin.port}", "localhost")
        with proxy(tmp, allow, pins=pins) as (session, port):
            state: dict[str, object] = {"port": port, "canary": canary, "session": session}
            yield state
            ok = exchange(port, f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n\r\n"
                          .encode())
            assert status(ok) == 200, "the proxy must still serve after the fuzzing"
            assert session.thread is not None and session.thread.is_alive()
            assert session.log is not None and session.log.denied > 100  # the fuzz got deep
            assert session.proxy is not None and session.proxy.failures == 0, "a crash"
        assert canary.connections == 0
    _wait_for_fds(before)


def _wait_for_fds(before: set[int]) -> None:
    deadline = time.monotonic() + 30
    while open_fds() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_fds() - before == set(), "descriptors leaked"


def test_500_concurrent_tunnels_then_no_descriptors_left(tmp_path: Path) -> None:
    count = 500
    before = open_fds()
    with Origin() as origin, proxy(tmp_path, ("origin.test",),
                                   pins=(("origin.test", "127.0.0.1"),)) as (session, port):
        established = threading.Barrier(count, timeout=120)

        def tunnel(i: int) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
                sock.sendall(f"CONNECT origin.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
                assert sock.recv(64).startswith(b"HTTP/1.1 200")
                established.wait()  # all 500 are open through the proxy at once
                sock.sendall(f"GET /{i} HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n"
                             .encode())
                return b"".join(iter(lambda: sock.recv(65536), b""))

        with ThreadPoolExecutor(count) as pool:
            answers = list(pool.map(tunnel, range(count)))
        wrong = [a for i, a in enumerate(answers) if not a.endswith(f"GET /{i} host=o\n".encode())]
        assert wrong == []
        assert origin.connections == count
        deadline = time.monotonic() + 30
        while session.thread is not None and time.monotonic() < deadline and \
                len(open_fds() - before) > 20:
            time.sleep(0.1)
    _wait_for_fds(before)


def test_closing_the_session_ends_open_tunnels(tmp_path: Path) -> None:
    before = open_fds()
    with Origin() as origin:
        session = open_session(Network(allow=("origin.test",),
                                       resolve=(("origin.test", "127.0.0.1"),)), str(tmp_path))
        assert isinstance(session, Session)
        with HostBridge(session) as bridge:
            socks = []
            for _ in range(5):
                s = socket.create_connection(("127.0.0.1", bridge.port), timeout=30)
                s.sendall(f"CONNECT origin.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
                assert s.recv(64).startswith(b"HTTP/1.1 200")
                socks.append(s)
            session.close()
            for s in socks:
                assert s.recv(64) == b""  # the proxy closed its end
                s.close()
            assert session.thread is not None and not session.thread.is_alive()
    _wait_for_fds(before)


REBIND = r"""
import ipaddress, socket, threading
from netns_prelude import start_remote
from corral.egress.session import open_session
from corral.policy import Network
from egress_util import Handler, HostBridge, Origin, exchange
remote, port = start_remote("11.22.33.1", "11.22.33.44")  # a public-looking peer, not ours
answers = []
def rebinding(name, _):  # the remote address first, then loopback, alternating
    answers.append(name)
    return [ipaddress.ip_address("11.22.33.44" if len(answers) % 2 else "127.0.0.1")]
class Canary(Origin):  # on loopback, at the remote origin's port
    def __init__(self, port):
        super(Origin, self).__init__(("127.0.0.1", port), Handler)
        self.connections, self.requests = 0, []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
with Canary(port) as canary:
    session = open_session(Network(allow=("rebind.test",)), None, resolver=rebinding)
    with session, HostBridge(session) as bridge:
        first = exchange(bridge.port, b"CONNECT rebind.test:%d HTTP/1.1\r\n\r\nGET / HTTP/1.1"
                         b"\r\nHost: r\r\n\r\n" % port)
        second = exchange(bridge.port, b"CONNECT rebind.test:%d HTTP/1.1\r\n\r\n" % port)
    seen = canary.connections
    exchange(canary.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")  # control: it is live
    print(seen, "|", first.split(b"\r\n")[0].decode(), "|", second.split(b"\r\n")[0].decode(),
          "|", first.rsplit(b"\n", 2)[-2].decode(), canary.connections, len(answers))
remote.kill()
"""


def test_dns_rebinding_cannot_redirect_a_checked_connection(who: Identity) -> None:
    """In network namespaces this test creates, a name answers a remote address, then
    loopback.  Each request is resolved once and connects to what was checked."""
    proc = run_in_netns(who, REBIND)
    assert proc.returncode == 0, proc.stderr
    seen, first, second, counts = (part.strip() for part in proc.stdout.split("|"))
    assert first == "HTTP/1.1 200 Connection established"
    assert second == "HTTP/1.1 403 Forbidden"  # the loopback answer is refused
    assert seen == "0"  # the loopback canary was never reached through the proxy...
    # ...though it is live (the control); the remote origin was reached once; each request
    # was resolved once.
    assert counts == "remote 1 1 2"


def test_a_failure_inside_the_proxy_is_a_logged_400_and_prints_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong while handling a request, the client gets an answer and the log
    a line, and nothing reaches stderr (which is the user's terminal)."""
    from corral.egress import http as http_module

    def broken(head: bytes) -> object:
        raise RuntimeError("a bug")

    with Origin() as origin, proxy(tmp_path, ("origin.test",),
                                   pins=(("origin.test", "127.0.0.1"),)) as (session, port):
        request = f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n\r\n".encode()
        assert status(exchange(port, request)) == 200  # control: the same request works
        monkeypatch.setattr(http_module, "parse_request", broken)
        response = exchange(port, request)
        assert status(response) == 400 and b"corral's proxy failed" in response
        assert session.proxy is not None and session.proxy.failures == 1
    assert [x["code"] for x in log_lines(tmp_path)] == ["allowed", "bad-request"]
    assert origin.connections == 1
    assert capfd.readouterr().err == ""


def test_request_bytes_held_go_back_to_the_budget(tmp_path: Path) -> None:
    """What each connection held while its request was read and its upstream connected
    returns to the run once the tunnel sent it on, or the connection ended: refused,
    relayed, dropped half-way or timed out.  Otherwise later requests would get 503."""
    from corral.egress.account import HOLD_BUDGET

    with Origin() as origin, proxy(tmp_path, ("origin.test",),
                                   pins=(("origin.test", "127.0.0.1"),)) as (session, port):
        target = f"origin.test:{origin.port}".encode()
        plain = exchange(port, b"GET http://" + target + b"/ HTTP/1.1\r\n\r\n")
        tunnel = exchange(port, b"CONNECT " + target + b" HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n"
                          b"Host: x\r\nConnection: close\r\n\r\n")
        refused = exchange(port, b"GET http://other.test/ HTTP/1.1\r\n\r\n")
        half = exchange(port, b"GET http://" + target + b"/ HTTP/1.1\r\nX: " + b"a" * 5000)
        assert [status(x) for x in (plain, tunnel, refused, half)] == [200, 200, 403, 400]
        account = session.account
        deadline = time.monotonic() + 30
        while account.hold_left != HOLD_BUDGET and time.monotonic() < deadline:
            time.sleep(0.05)
        assert account.hold_left == HOLD_BUDGET
        # Control: a connection that is still sending its head holds what it sent.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET http://" + target + b"/ HTTP/1.1\r\nX: " + b"a" * 5000)
            while account.hold_left == HOLD_BUDGET and time.monotonic() < deadline + 30:
                time.sleep(0.05)
            assert HOLD_BUDGET - account.hold_left >= 5000


def test_a_tunnel_gives_back_what_it_started_with_once_that_is_sent() -> None:
    """A stalled upstream keeps the request's bytes in the proxy's memory: they stay held
    against the run's budget until they are out.  (Giving them back when the tunnel starts,
    as the reverse pump's empty start once did, would let stalled tunnels hold them free.)"""
    import asyncio

    from corral.egress.relay import Tunnel

    loop = asyncio.new_event_loop()
    client, client_peer = socket.socketpair()
    upstream, origin = socket.socketpair()
    for sock in (client, upstream):
        sock.setblocking(False)
    upstream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    released: list[int] = []
    closed: list[Tunnel] = []
    first = b"x" * (1 << 20)  # far more than the sockets between us and the origin hold
    tunnel = Tunnel(loop, bytearray(1 << 16), client, upstream, closed.append,
                    on_sent=lambda: released.append(1))
    try:
        tunnel.start(first, b"")
        loop.run_until_complete(asyncio.sleep(0.3))
        assert released == [] and tunnel.outbound.pending  # stalled: still held
        got = 0
        origin.settimeout(30)
        while got < len(first):  # the origin reads: the bytes go out
            got += len(origin.recv(1 << 16))
            loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0.05))
        assert released == [1] and got == len(first)
    finally:
        tunnel.close()
        loop.close()
        for sock in (client_peer, origin):
            sock.close()
    assert released == [1]  # given back once, not again when the tunnel closes
