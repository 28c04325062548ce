"""``corral serve``: run requests over HTTP (``corral[serve]``), SandboxFusion-compatible.

See :mod:`corral.serve.app` for the routes, :mod:`corral.serve.config` for what the server
allows, and docs/scale.md for how to point a veRL reward function or a code-evaluation
harness at it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UsageError
from ..httpauth import add_argument as add_token_argument
from ..httpauth import read_token
from ..options import Args
from ..record import replace
from .config import Caps, Config

__all__ = ["Caps", "Config", "add_arguments", "main", "serve", "uvicorn_options"]


def serve(config: Config) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM: runs in progress finish first)."""
    try:
        import uvicorn
    except ImportError:
        raise UsageError("corral serve needs uvicorn, which is not installed",
                         "the HTTP server is an optional extra of corral",
                         "pip install 'corral[serve]'") from None
    from .app import App

    uvicorn.run(App(config), **uvicorn_options(config))


def uvicorn_options(config: Config) -> dict[str, Any]:
    """How uvicorn serves ``config``.  No ``limit_concurrency``: it counts idle connections,
    so a few hundred of them made every request a 503.  Idle and slow connections are bounded
    by :mod:`corral.httpguard` instead, the bytes held by ``--max-pending``, the runs by the
    queue."""
    from ..httpguard import protocol

    return {"host": config.host, "port": config.port, "log_level": "warning",
            "access_log": False, "lifespan": "on", "timeout_graceful_shutdown": None,
            "http": protocol(), "backlog": 2 * (config.workers + config.queue) + 16}


def add_arguments(s: argparse.ArgumentParser) -> None:
    """The options of ``corral serve``."""
    s.usage = "corral serve [--host ADDR] [--port N] [--workers N] [--token-file FILE] ..."
    s.description = ("Serve requests over HTTP: POST /run_code and /run_code/batch "
                     "(SandboxFusion's API), POST /v1/runs (corral's RunRequest), GET /healthz "
                     "and /metrics.  Needs corral[serve].  See docs/scale.md.")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                   "any other needs a token)")
    s.add_argument("--port", default="8080", metavar="N")
    s.add_argument("--workers", metavar="N", help="runs at once (default: two per core)")
    s.add_argument("--queue", default="256", metavar="N",
                   help="requests that may wait beyond those (default 256); more get 429")
    add_token_argument(s)
    s.add_argument("--max-timeout", default="60", metavar="SECONDS",
                   help="the longest run (and compile step) a request may ask for")
    s.add_argument("--max-memory", default="2G", metavar="SIZE")
    s.add_argument("--max-output", default="8M", metavar="SIZE",
                   help="captured stdout and stderr of one run, each")
    s.add_argument("--max-body", default="32M", metavar="SIZE", help="one request's body")
    s.add_argument("--max-pending", default="256M", metavar="SIZE",
                   help="request bodies and answers held at once, in all; beyond it 429")
    s.add_argument("--allow-domain", metavar="NAME", action="append", default=[],
                   help="a name requests may ask to reach (repeatable; default: none)")
    s.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="bound to loopback, also answer requests naming NAME in Host and "
                   "Origin (a reverse proxy's name; repeatable)")
    s.add_argument("--runs-dir", metavar="DIR", help="where per-run directories go")


def main(args: Args) -> int:
    """``corral serve``, from its parsed options."""
    from ..cli import _count
    from ..engines.local import default_workers
    from ..policy import parse_duration, parse_size

    token = read_token(args.token_file)
    longest = parse_duration(args.max_timeout, "--max-timeout")
    caps = replace(Caps(), timeout_s=longest, compile_timeout_s=longest,
                   memory_bytes=parse_size(args.max_memory, "--max-memory"),
                   output_bytes=parse_size(args.max_output, "--max-output"))
    config = Config(host=args.host, port=int(_count(args.port, "--port", int)),
                    workers=int(_count(args.workers, "--workers", int)) if args.workers
                    else default_workers(), queue=int(args.queue) if args.queue.isdigit()
                    else -1, token=token, caps=caps,
                    max_body=parse_size(args.max_body, "--max-body"),
                    max_pending=parse_size(args.max_pending, "--max-pending"),
                    allow_domains=tuple(args.allow_domain),
                    allow_hosts=tuple(args.allow_host), runs_dir=args.runs_dir)
    print(f"corral: serving on http://{args.host}:{config.port} "
          f"({config.workers} at once, {config.queue} queued)", file=sys.stderr, flush=True)
    serve(config)
    return 0
