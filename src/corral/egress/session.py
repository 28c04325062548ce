"""One run's egress session, and what the sandbox needs to use it.

Typical use, by ``corral run`` and agent mode alike::

    with egress.open_session(policy.network, run_dir.root) as net:
        sb = net.attach(sb)            # proxy variables, the bridge file, its config
        outcome = launch(sb, extra_fds=net.pass_fds, ...)
    denials = net.denials()            # for Result.denials; every decision is in net.log_path

When the policy allows no name at all there is no proxy and no bridge:
:func:`open_session` returns a :class:`NoEgress` whose ``attach`` changes
nothing, and the sandbox keeps a network namespace with only loopback.

A :class:`Session` owns a thread running the proxy's event loop, the unix
socket pair to the bridge, and the decision log.  It is started before
bwrap and, on every path out of the ``with`` block, stopped: every client
and upstream socket closed, the thread joined, both ends of the pair and
the log closed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..bwrap import Sandbox
from ..errors import LaunchError
from ..policy import Network
from .account import BYTE_BUDGET, Account
from .log import DecisionLog
from .off import NoEgress
from .rules import BRIDGE_PORT, Rules, compile_rules

if TYPE_CHECKING:  # asyncio costs ~15 ms to import: only a run that allows a name pays it
    import asyncio

    from .proxy import Proxy, Resolver

__all__ = ["BRIDGE_PATH", "BRIDGE_PORT", "Bridge", "NoEgress", "Session", "attach",
           "open_session", "plan_bridge", "proxy_env"]

BRIDGE_PATH = "/run/corral/bridge.py"  # beside the init (bwrap.INIT_PATH)
LOG_NAME = "egress.jsonl"
MAX_CONNECTIONS = 1024  # open client connections per run
FDS_PER_CONNECTION = 2  # the client's socket and the upstream socket
STOP_TIMEOUT_S = 30.0


def proxy_env(port: int = BRIDGE_PORT) -> tuple[tuple[str, str], ...]:
    """Variables that point common clients at the bridge.

    ``ALL_PROXY`` is ``http://`` too: httpx (the OpenAI and Anthropic SDKs)
    refuses to start with a ``socks5://`` proxy unless an extra package is
    installed.  SOCKS5 is served on the same port for clients told to use it.
    ``NO_PROXY`` keeps the sandbox's own loopback (its own servers) direct; a
    loopback port that a rule allows on the host is relayed by the bridge
    listening on it inside (:meth:`Rules.relays`), so it works direct too.
    """
    url = f"http://127.0.0.1:{port}"
    env = [(name, url) for base in ("http_proxy", "https_proxy", "all_proxy")
           for name in (base.upper(), base)]
    env += [("NO_PROXY", "localhost,127.0.0.1,::1"), ("no_proxy", "localhost,127.0.0.1,::1"),
            ("NODE_USE_ENV_PROXY", "1")]
    return tuple(env)


def bridge_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "bridge.py"), "rb") as f:
        return f.read()


@dataclass(frozen=True, slots=True)
class Bridge:
    """What corral's init needs to start the bridge: the pair's descriptor and the port."""

    fd: int | None  # None in --dry-run: the descriptor exists only at launch
    port: int = BRIDGE_PORT
    relays: tuple[tuple[str, int], ...] = ()  # loopback addresses and ports also listened on

    def config(self) -> dict[str, Any]:
        return {"path": BRIDGE_PATH, "fd": self.fd, "port": self.port,
                "relays": [list(r) for r in self.relays]}


def plan_bridge(rules: Rules, fd: int | None = None) -> Bridge:
    """The bridge for ``rules``: the proxy port, and every relayed loopback port."""
    return Bridge(fd, relays=tuple((str(r.listen), r.port) for r in rules.relays()))


def attach(sb: Sandbox, bridge: Bridge) -> Sandbox:
    """``sb`` with the bridge handed in, its config for the init, and the proxy variables.

    Pure.  The proxy variables come last, so they win over a policy's own.
    """
    env = dict(sb.env)
    env.update(proxy_env(bridge.port))
    return replace(sb, env=tuple(env.items()),
                   files=(*sb.files, (BRIDGE_PATH, bridge_source())),
                   init_config={**sb.init_config, "egress": bridge.config()})


class Session:
    """A running proxy for one run; use as a context manager (see the module docstring)."""

    def __init__(self, rules: Rules, record_dir: str | None, *,
                 resolver: Resolver | None = None,
                 max_connections: int = MAX_CONNECTIONS, cpu_share: float | None = None,
                 byte_budget: int | None = BYTE_BUDGET) -> None:
        self.rules = rules
        self.account = Account(cpu_share, byte_budget)
        self.proxy: Proxy | None = None
        self.log_path = None if record_dir is None else os.path.join(record_dir, LOG_NAME)
        self.resolver = resolver
        self.max_connections = _fd_budget(max_connections)
        self.log: DecisionLog | None = None
        self.ours: socket.socket | None = None
        self.theirs: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.ready = threading.Event()

    def start(self) -> Session:
        """Start the proxy thread; returns once it is receiving.  Raises LaunchError."""
        try:
            self.log = DecisionLog(self.log_path)
            self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as e:
            self.close()
            raise LaunchError("cannot start the egress proxy", e.strerror or str(e),
                              "check the run directory and the open-file limit") from None
        self.thread = threading.Thread(target=self._run, name="corral-egress", daemon=True)
        self.thread.start()
        if not self.ready.wait(STOP_TIMEOUT_S) or self.failure is not None:
            self.close()
            raise LaunchError("the egress proxy did not start", str(self.failure or "timeout"),
                              "report this as a bug")
        return self

    def _run(self) -> None:
        import asyncio

        from .proxy import Proxy, system_resolver

        loop = asyncio.new_event_loop()
        from .proxy import Run

        run = Run(self.rules, self.log or DecisionLog(None), self.account)
        proxy = self.proxy = Proxy(run, self.resolver or system_resolver, self.max_connections)
        try:
            assert self.ours is not None
            proxy.attach(loop, self.ours)
            self.stop = loop.create_future()
            self.loop = loop
            self.ready.set()
            loop.run_until_complete(self.stop)
            loop.run_until_complete(proxy.shutdown())
        except BaseException as e:  # reported to start(); the thread must not die silently
            self.failure = e
            self.ready.set()
        finally:
            loop.close()

    @property
    def bridge(self) -> Bridge:
        assert self.theirs is not None, "the session is not started"
        return plan_bridge(self.rules, self.theirs.fileno())

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptor the launcher hands to bwrap (the sandbox's end of the pair)."""
        return () if self.theirs is None else (self.theirs.fileno(),)

    def attach(self, sb: Sandbox) -> Sandbox:
        return attach(sb, self.bridge)

    def denials(self) -> tuple[dict[str, Any], ...]:
        """The first denials of the run (after :meth:`close`, all of them are final)."""
        return () if self.log is None else self.log.denials()

    def close(self) -> None:
        """Stop the proxy, close every connection, join the thread, close every descriptor."""
        loop, stop = self.loop, self.stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_finish, stop)
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT_S)
        for sock in (self.ours, self.theirs):
            if sock is not None:
                sock.close()
        if self.log is not None:
            self.log.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _finish(stop: asyncio.Future[None]) -> None:
    if not stop.done():
        stop.set_result(None)


def _fd_budget(wanted: int) -> int:
    """Raise this process's soft open-file limit for ``wanted`` connections, if it can.

    Returns how many connections fit.  Only the soft limit moves, never above
    the hard one; the payload's own limit is set separately by the init.
    """
    need = wanted * FDS_PER_CONNECTION + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, (soft - 256) // FDS_PER_CONNECTION))


def open_session(network: Network, record_dir: str | None, *,
                 resolver: Resolver | None = None,
                 max_connections: int = MAX_CONNECTIONS, cpu_share: float | None = None,
                 byte_budget: int | None = BYTE_BUDGET) -> Session | NoEgress:
    """Start the egress proxy for one run, or return :class:`NoEgress` if nothing is allowed.

    ``record_dir`` is the run's directory (``RUNS/<run-id>``): every decision
    is appended to ``egress.jsonl`` there.  Raises UsageError for bad rules
    and LaunchError if the proxy cannot start; either way nothing is left open.
    ``cpu_share`` (the run's ``--cpus``) bounds the proxy's CPU time for this
    run, and ``byte_budget`` what its tunnels buffer (:mod:`.account`).
    """
    rules = compile_rules(network)
    if not rules.enabled:
        return NoEgress()
    return Session(rules, record_dir, resolver=resolver, max_connections=max_connections,
                   cpu_share=cpu_share, byte_budget=byte_budget).start()
