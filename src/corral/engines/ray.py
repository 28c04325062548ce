"""The Ray engine: each request a Ray task, run by corral on whichever node Ray picks.

A thin layer over :mod:`corral.ray` that joins a cluster (``--address``, else
``RAY_ADDRESS``, else a new single-node Ray on this machine, bound to 127.0.0.1, without
its dashboard) and leaves it again when the batch is done.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import UsageError
from ..request import RunRequest
from ..result import RunResult

__all__ = ["RayEngine"]

LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


class RayEngine:
    """``workers``: tasks in flight at once (default: twice the cluster's CPUs); ``retries``:
    how often Ray runs a task again whose worker or node died (default 3)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, workers: int | None = None,
                 runs_dir: str | None = None, keep: bool = False,
                 retries: int | None = None) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.here = self.address is None or self.address.rsplit(":", 1)[0] in LOOPBACK
        if self.here:
            # Ray turns a loopback address into this machine's outward one ("remotely
            # reachable") unless clusters are off, and then keeps everything on loopback:
            # a cluster on this machine needs nothing else, and must bind nothing else.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        try:
            import ray
        except ImportError:
            raise UsageError("--engine ray needs Ray, which is not installed",
                             "Ray is an optional extra of corral",
                             "pip install 'corral[ray]'") from None
        if self.here:  # imported before the variable was set: the same switch, by hand
            ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        self.saved_env: dict[str, str | None] = {}  # what _own_token changed
        self.workers = workers or 0
        self.retries = retries
        self.runs_dir = runs_dir
        self.keep = keep

    def _join(self) -> bool:
        """Connect (or start a local Ray); True when this engine must shut it down."""
        import ray

        if ray.is_initialized():
            return False
        quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                 "logging_level": logging.WARNING, "configure_logging": False}
        if self.address is None:
            self._own_token()
        try:
            # No address: a new Ray of its own ("local"), never whatever cluster happens to
            # be running on this machine (Ray's own default would join it).
            ray.init(address=self.address or "local",
                     _node_ip_address="127.0.0.1" if self.here else None, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"cannot join the Ray cluster at {self.address or 'a new local'}",
                             str(e).strip().splitlines()[0] if str(e).strip() else "",
                             "start it with 'ray start --head', or check --address") from None
        return True

    def _own_token(self) -> None:
        """A Ray of corral's own gets a fresh token, in the environment of its processes
        only.  Left to itself, Ray writes one to ~/.ray/auth_token, mode 0644: in a home
        other users may enter (useradd's default here), any local user could read it, and
        whoever holds it may run code on the cluster as the user who runs the batch.  A
        RAY_AUTH_MODE set by the user stands."""
        if "RAY_AUTH_MODE" in os.environ:
            return
        self.saved_env = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        _reload_auth()

    def _restore_env(self) -> None:
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.saved_env:
            _reload_auth()
        self.saved_env = {}

    def map(self, requests: Iterable[RunRequest]) -> Iterator[RunResult]:
        import ray

        from .. import ray as corral_ray

        owned = False
        try:
            owned = self._join()
            options = {} if self.retries is None else {"max_retries": self.retries}
            yield from corral_ray.map(requests, in_flight=self.workers or None,
                                      runs_dir=self.runs_dir, keep=self.keep, **options)
        finally:
            if owned:
                ray.shutdown()
            self._restore_env()


def _reload_auth() -> None:
    """Make this process's Ray read the auth variables again: its config and its token are
    cached from the first use, and a cluster started with a token this process does not
    present refuses it ("InvalidAuthToken").  Ray's own tests do the same; Rays without
    token authentication have neither, and need nothing."""
    try:
        from ray._raylet import (  # type: ignore[attr-defined]  # not in its stubs
            AuthenticationTokenLoader,
            Config,
        )
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
