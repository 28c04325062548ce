"""Egress: the only way out of a sandbox, through corral's filtering proxy.

    hosts    host names (IDNA 2008), IP literals, ports; special addresses (pure)
    rules    which names, ports and addresses may be reached (pure)
    http     strict HTTP/1.x request heads: parse, check, rewrite (pure)
    socks    SOCKS5 CONNECT (pure)
    account  one run's CPU share and byte budget in the proxy (pure)
    local    whether an address is this host's own (netlink route lookup)
    opener   decide, resolve, admit, connect
    handshake  reading one client's request (paced, timed), answering in its protocol
    proxy    the host-side asyncio proxy of one run
    relay    moving a tunnel's bytes
    log      the run's decision log (``egress.jsonl``)
    session  one run's proxy session, and :func:`attach` for the sandbox
    forked   the session's proxy in a child process, for corral's CLI
    bridge   the in-sandbox bridge, run by corral's init (standard library only)

Names are imported lazily: :mod:`corral.policy` validates rules through
:mod:`.rules` and must not pay for asyncio.
"""

from __future__ import annotations

__all__ = ["Bridge", "Decision", "NoEgress", "Rules", "Session", "attach", "compile_rules",
           "fork_proxies", "open_session", "plan_bridge", "prefork", "proxy_env"]

FORK_PROXIES = False  # see fork_proxies

_WHERE = {"Decision": "rules", "Rules": "rules", "compile_rules": "rules",
          "Bridge": "session", "NoEgress": "off", "Session": "session", "attach": "session",
          "open_session": "session", "plan_bridge": "session", "prefork": "session",
          "proxy_env": "session"}

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

    from .off import NoEgress
    from .rules import Decision, Rules, compile_rules
    from .session import Bridge, Session, attach, open_session, plan_bridge, prefork, proxy_env


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'corral.egress' has no attribute {name!r}")
    # __import__ with a fromlist gives the submodule itself (corral/__init__.py says why)
    return getattr(__import__(f"{__name__}.{_WHERE[name]}", fromlist=[name]), name)


def fork_proxies() -> None:
    """Run each session's proxy in a forked child process instead of a thread (see
    :mod:`.forked`).  For corral's CLI only, which owns its process: never a library
    caller's, whose other threads may hold locks a fork would copy held."""
    global FORK_PROXIES
    FORK_PROXIES = True
