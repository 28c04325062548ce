"""``corral serve``: run requests over HTTP (``corral[serve]``), SandboxFusion-compatible.

See :mod:`corral.serve.app` for the routes, :mod:`corral.serve.config` for what the server
allows, and docs/serve.md for how to point a veRL reward function or a code-evaluation
harness at it.
"""

from __future__ import annotations

from .config import Caps, Config

__all__ = ["Caps", "Config", "serve"]


def serve(config: Config) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM: runs in progress finish first)."""
    try:
        import uvicorn
    except ImportError:
        from ..errors import UsageError

        raise UsageError("corral serve needs uvicorn, which is not installed",
                         "the HTTP server is an optional extra of corral",
                         "pip install 'corral[serve]'") from None
    from .app import App

    backlog = config.workers + config.queue
    uvicorn.run(App(config), host=config.host, port=config.port, log_level="warning",
                access_log=False, lifespan="on", timeout_graceful_shutdown=None,
                # Connections beyond this get uvicorn's 503 before their bodies are read: what
                # waits for admission is bounded by it, times the body cap.
                limit_concurrency=2 * backlog + 16, backlog=2 * backlog + 16)
