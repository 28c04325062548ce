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
bwrap, which is launched without waiting for the thread to import asyncio
(~15-20 ms): the bridge's ``sendmsg`` on the pair blocks, so a connection made
at once waits there until the proxy reads it.  (A launcher that starts bwrap by
forking itself, with a Python ``preexec_fn``, calls :meth:`Session.wait` first:
a fork while the thread holds the import or logging locks would leave the child
with locks no one releases.)  On every path out of the
``with`` block it is stopped: every client and upstream socket closed, the
thread joined, both ends of the pair and the log closed.  The proxy's end of
the pair and the log belong to the thread, which closes them as it ends; if it
has not ended in :data:`STOP_TIMEOUT_S`, they are left to it, never closed
under it (a closed descriptor's number is soon another file's).  A proxy that
fails to start closes its end, so the bridge relays nothing (each client sees
its connection reset), and :attr:`Session.error` says why: the run ends in
status ``error``.

Started by corral's CLI (:func:`corral.egress.fork_proxies`), in a process
with no other thread, the proxy runs in a forked child instead of the thread,
so that its import runs on the other core (:mod:`.forked`); everything above
holds for it alike.
"""

from __future__ import annotations

import _socket  # not socket (~2.5 ms, its enums): the launcher only makes the pair
import contextlib
import os
import resource
import threading
from types import TracebackType

from ..bwrap import Sandbox
from ..errors import LaunchError, start_thread
from ..policy import Network
from ..record import Record, replace
from . import forked
from .account import BYTE_BUDGET, Account
from .log import DecisionLog
from .off import NoEgress
from .rules import BRIDGE_PORT, Rules, compile_rules

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:  # asyncio costs ~15 ms to import: only a run that allows a name pays it
    import asyncio
    from typing import Any

    from .proxy import Proxy, Resolver

__all__ = ["BRIDGE_PATH", "BRIDGE_PORT", "Bridge", "NoEgress", "Session", "attach",
           "open_session", "plan_bridge", "prefork", "proxy_env"]

BRIDGE_PATH = "/run/corral/bridge.py"  # beside the init (bwrap.INIT_PATH)
LOG_NAME = "egress.jsonl"
MAX_CONNECTIONS = 1024  # open client connections per run
FDS_PER_CONNECTION = 2  # the client's socket and the upstream socket
STOP_TIMEOUT_S = 30.0
BRIDGE_BATCH = 64  # see Bridge.batch


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


class Bridge(Record, frozen=True):
    """What corral's init needs to start the bridge: the pair's descriptor and the port."""

    fd: int | None  # None in --dry-run: the descriptor exists only at launch
    port: int = BRIDGE_PORT
    relays: tuple[tuple[str, int], ...] = ()  # loopback addresses and ports also listened on
    # Connections the init passes on per wake-up before it looks at the launcher and the
    # payload again (a payload's connect flood must not starve those watches).
    batch: int = BRIDGE_BATCH

    def config(self) -> dict[str, Any]:
        return {"path": BRIDGE_PATH, "fd": self.fd, "port": self.port,
                "relays": [list(r) for r in self.relays], "batch": self.batch}


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
        self.ours: _socket.socket | None = None
        self.theirs: _socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None  # the proxy failed: the run is an error
        self.teardown_failure: BaseException | None = None  # its shutdown failed afterwards
        self.ready = threading.Event()  # set once the proxy is receiving, or has failed
        self.lock = threading.Lock()  # orders the thread's attach against close()
        self.closing = False
        self.child: forked.Child | None = None  # the proxy's process, when forked
        self.stop_fd: int | None = None  # in that process: the parent's stop pipe
        self.remote_denials: tuple[dict[str, Any], ...] = ()

    def start(self) -> Session:
        """Start the proxy thread and return at once (see the module docstring).

        Raises LaunchError when the pair, the log or the proxy's process cannot be made."""
        try:
            self.log = DecisionLog(self.log_path)
            self.ours, self.theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            if _forking():
                self.child = forked.fork_child(self)
        except OSError as e:
            self.close()
            raise _cannot_start(e) from None
        if self.child is not None:  # the pair's end and the log are the child's alone
            self.ours.close()
            self.log.close()
            return self
        # From here on, ours and the log are the thread's to close.
        self.thread = start_thread(self._run, "corral-egress", self.ours, self.log)
        return self

    def begin(self, record_dir: str | None) -> Session:
        """Start a session made by :func:`prefork`: its log opened here and handed to the
        proxy's process, which imported the proxy meanwhile.  Raises LaunchError as
        :meth:`start` does (the session is closed then)."""
        assert self.child is not None and self.child.ctl is not None, "not a preforked session"
        self.log_path = None if record_dir is None else os.path.join(record_dir, LOG_NAME)
        try:
            self.log = DecisionLog(self.log_path)
            self.child.hand_log(self.log)
        except OSError as e:
            self.close()
            raise _cannot_start(e) from None
        self.log.close()  # the child's alone
        return self

    def discard(self) -> None:
        """A :func:`prefork` session whose run ended before :meth:`begin`: its process
        killed, its pair closed.  Nothing once begun (the ``with`` block closes it)."""
        if self.child is None or self.child.ctl is None:
            return
        child, self.child = self.child, None
        child.abandon()
        self.close()

    def quiesce(self) -> None:
        """Before this process forks (a launcher's Python ``preexec_fn``): wait until the
        proxy's thread holds no import or logging lock.  A forked proxy has no thread."""
        if self.child is None:
            self.wait()

    def wait(self) -> Proxy:
        """Block until the proxy is receiving (for callers that inspect it); LaunchError
        if it failed to start."""
        if not self.ready.wait(STOP_TIMEOUT_S) or self.proxy is None or self.loop is None:
            raise LaunchError("the egress proxy did not start", self.error or "timeout",
                              "report this as a bug")
        return self.proxy

    @property
    def error(self) -> str | None:
        """Why the proxy failed, for the run's record; None while it has not."""
        if self.failure is None:
            return None
        what = self.failure.what if isinstance(self.failure, forked.ProxyFailed) \
            else f"{type(self.failure).__name__}: {self.failure}"
        return f"the egress proxy failed ({what}); no connection was relayed after that"

    def _run(self, ours: _socket.socket, log: DecisionLog) -> None:
        try:
            self._serve(ours, log)
        except BaseException as e:  # kept for close() and the record: never a silent death
            self.failure = e
        finally:
            ours.close()  # the bridge's sends now fail: its clients see a reset
            log.close()
            self.ready.set()

    def _serve(self, ours: _socket.socket, log: DecisionLog) -> None:
        import asyncio

        from .proxy import Proxy, Run, system_resolver

        loop = asyncio.new_event_loop()
        try:
            proxy = Proxy(Run(self.rules, log, self.account), self.resolver or system_resolver,
                          self.max_connections)
            with self.lock:
                if self.closing:  # the run ended before the proxy was ready
                    return
                proxy.attach(loop, ours)
                self.proxy, self.stop, self.loop = proxy, loop.create_future(), loop
            self.ready.set()
            if self.stop_fd is not None:  # forked: the parent's stop pipe ends the proxy
                loop.add_reader(self.stop_fd, _stop_read, loop, self.stop_fd, self.stop)
            loop.run_until_complete(self.stop)
            try:
                loop.run_until_complete(proxy.shutdown())
            except BaseException as e:  # the run is over: kept, but it relayed what it had
                self.teardown_failure = e
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
        if self.failure is not None:  # failed already: nothing is launched
            raise LaunchError("the egress proxy did not start", str(self.error),
                              "report this as a bug")
        return attach(sb, self.bridge)

    def denials(self) -> tuple[dict[str, Any], ...]:
        """The first denials of the run (after :meth:`close`, all of them are final;
        a forked proxy's only then)."""
        if self.remote_denials:
            return self.remote_denials
        return () if self.log is None else self.log.denials()

    def close(self) -> None:
        """Stop the proxy, close every connection, join the thread, close every descriptor
        (those the thread owns: only once it has ended)."""
        if self.child is not None:
            child, self.child = self.child, None
            self._ended(child.finish(STOP_TIMEOUT_S))
        with self.lock:
            self.closing = True
            loop, stop = self.loop, self.stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed already
                loop.call_soon_threadsafe(_finish, stop)
        if self.thread is not None:
            self.thread.join(STOP_TIMEOUT_S)
        elif self.ours is not None or self.log is not None:  # start() failed: no thread
            for held in (self.ours, self.log):
                if held is not None:
                    held.close()
        if self.theirs is not None:
            self.theirs.close()  # the launcher's end; the thread never touches it

    def _ended(self, result: dict[str, Any]) -> None:
        """The forked proxy's last words: its failure and the run's first denials."""
        failure, denials = result.get("failure"), result.get("denials")
        if failure is not None:
            self.failure = forked.ProxyFailed(str(failure))
        if isinstance(denials, list):
            self.remote_denials = tuple(d for d in denials if isinstance(d, dict))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _finish(stop: asyncio.Future[None]) -> None:
    if not stop.done():
        stop.set_result(None)


def _stop_read(loop: asyncio.AbstractEventLoop, fd: int, stop: asyncio.Future[None]) -> None:
    """The stop pipe is readable only once the parent's end is closed: stop, once."""
    loop.remove_reader(fd)
    _finish(stop)


def _cannot_start(e: OSError) -> LaunchError:
    """What :meth:`Session.start` and :meth:`Session.begin` raise when the pair, the log
    or the proxy's process cannot be made."""
    return LaunchError("cannot start the egress proxy", e.strerror or str(e),
                       "check the run directory, the open-file and process limits")


def prefork(network: Network, *, cpu_share: float | None = None) -> Session | None:
    """The proxy's process for a run that allows a name, forked now, before the run's
    directory exists, so that it imports the proxy while the launcher prepares the run
    (:mod:`.forked`); pass it to :func:`open_session` as ``early``, and
    :meth:`Session.discard` it on every path (nothing once begun).  None where the
    proxy would not be forked (not the CLI, another thread), or nothing is allowed, or
    the fork failed: :func:`open_session` then starts the proxy as usual."""
    if not network.allow or not _forking():
        return None
    rules = compile_rules(network)
    if not rules.enabled:
        return None
    session = Session(rules, None, cpu_share=cpu_share)
    try:
        session.ours, session.theirs = _socket.socketpair(_socket.AF_UNIX,
                                                          _socket.SOCK_SEQPACKET)
        session.child = forked.fork_child(session, early=True)
    except OSError:
        session.close()
        return None
    session.ours.close()  # the child's alone
    return session


def _forking() -> bool:
    """Whether to fork the proxy: asked by the CLI, and no other thread exists to have
    its locks copied held into the child."""
    from . import FORK_PROXIES

    return FORK_PROXIES and threading.active_count() == 1


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
                 byte_budget: int | None = BYTE_BUDGET, early: Session | None = None
                 ) -> Session | NoEgress:
    """Start the egress proxy for one run, or return :class:`NoEgress` if nothing is allowed.

    ``record_dir`` is the run's directory (``RUNS/<run-id>``): every decision
    is appended to ``egress.jsonl`` there.  Raises UsageError for bad rules
    and LaunchError if the proxy cannot start; either way nothing is left open.
    ``cpu_share`` (the run's ``--cpus``) bounds the proxy's CPU time for this
    run, and ``byte_budget`` what its tunnels buffer (:mod:`.account`).
    ``early``: this run's :func:`prefork` session (made from the same ``network`` and
    ``cpu_share``), begun here instead of a new one.
    """
    rules = compile_rules(network)
    if not rules.enabled:
        return NoEgress()
    if early is not None:
        if (early.rules == rules and early.account.cpu_share == cpu_share and resolver is None
                and max_connections == MAX_CONNECTIONS and byte_budget == BYTE_BUDGET):
            return early.begin(record_dir)
        early.discard()  # made for other rules or limits: never this run's proxy
    return Session(rules, record_dir, resolver=resolver, max_connections=max_connections,
                   cpu_share=cpu_share, byte_budget=byte_budget).start()
