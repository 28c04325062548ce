"""``corral mcp`` on the command line: its own options, checked before anything starts, and
the start of the server.  The CLI (:mod:`corral.cli`) gives it the options every verb shares
and maps its errors to exit 125; the MCP SDK is imported only once the options are good.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import httpauth
from ..errors import UsageError
from ..httpauth import add_argument as add_token_argument
from ..options import Args
from ..policy import Policy, parse_duration
from ..request import PROFILES

__all__ = ["add_arguments", "serve"]


def add_arguments(m: argparse.ArgumentParser) -> None:
    """The options of ``corral mcp`` beyond those it shares with ``corral run``."""
    m.usage = ("corral mcp [--profile python|node|shell] [limits, --allow-domain ...] "
               "[--transport stdio|http] [--host H --port N]")
    m.description = ("Serve corral's sandbox as MCP tools (run_code, run_command, read_file, "
                     "write_file, list_files): each MCP session gets its own workspace, kept "
                     "across its calls and removed when it ends.  The policy is fixed here; "
                     "no tool call can widen it.  Needs corral[mcp].  See docs/agents.md.")
    m.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                   help="stdio (default: for 'claude mcp add' and Codex) or streamable HTTP")
    m.add_argument("--host", default="127.0.0.1",
                   help="HTTP: address to listen on (default 127.0.0.1; any other needs a "
                   "token)")
    m.add_argument("--port", type=int, default=8000, help="HTTP: port (default 8000; 0 picks "
                   "a free one, printed on stderr)")
    add_token_argument(m, "HTTP: ")
    m.add_argument("--max-sessions", metavar="N", default="8",
                   help="HTTP: sessions open at once, each with a workspace (default 8)")
    m.add_argument("--idle-timeout", metavar="SECONDS", default="30m",
                   help="HTTP: end a session idle this long, removing its workspace "
                   "(default 30m)")


def _sessions(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"--max-sessions {text!r} is not a positive integer", "",
                         "write it like --max-sessions 8")
    return value


def _profile(name: str | None) -> str:
    profile = name or "python"
    if "/" not in profile and not profile.endswith(".toml") and profile not in PROFILES:
        raise UsageError(f"corral mcp does not serve the {profile!r} profile",
                         "agent profiles open a model API and lift the run-mode limits",
                         f"use one of {', '.join(PROFILES)}, or a TOML file")
    return profile


def serve(args: Args, policy_of: Callable[[Args, str], Policy],
          env_of: Callable[[Sequence[str]], list[tuple[str, str]]]) -> int:
    """Check every option, then serve until the client or a signal ends it; 0 when it did."""
    policy = policy_of(args, _profile(args.profile))
    env = tuple(env_of(args.env))
    sessions = _sessions(args.max_sessions)
    idle = parse_duration(args.idle_timeout, "--idle-timeout")
    try:
        from . import server as front
        from . import session
    except ImportError as e:
        raise UsageError("corral mcp needs the MCP SDK", str(e),
                         "install it: pip install 'corral[mcp]'") from None
    token = httpauth.required(httpauth.read_token(args.token_file), args.host, "corral mcp") \
        if args.transport == "http" else None
    if args.dry_run:
        _dry_run(policy, args.runs_dir, env)
        return 0
    server = session.Server(policy, args.runs_dir, sessions, env=env)
    front.serve(server, args.transport, host=args.host, port=args.port, token=token,
                idle_s=idle, max_sessions=sessions)
    return 0


def _dry_run(policy: Policy, runs_dir: str | None, env: tuple[tuple[str, str], ...]) -> None:
    """What the agent is told, and the sandbox one call (run_command /bin/true) would get."""
    from .. import api
    from ..host import detect
    from ..launch import dry_run_lines
    from . import tools

    sb: Any = api.plan(["/bin/true"], policy, runs_dir=runs_dir, env=env)
    print(tools.describe(policy))
    print("\n".join(dry_run_lines(sb, detect().require_bwrap())))
    sys.stdout.flush()
