"""What a ``corral serve`` allows: bind address, token, concurrency, and per-request caps.

The server's maximums bound every request: corral's own ``/v1/runs`` refuses a request that
asks for more (400, saying the maximum); the SandboxFusion-compatible ``/run_code`` lowers it
to the maximum, as a SandboxFusion client expects its numbers to be taken.  A limit a request
leaves out gets the lower of the profile's default and the server's maximum.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..engines.local import default_workers
from ..errors import UsageError
from ..httpauth import required
from ..request import LIMIT_KEYS, RequestLimits, RunRequest

__all__ = ["Caps", "Config", "cap_request"]


@dataclass(frozen=True, slots=True)
class Caps:
    """Server-side maximums, one per request limit (``None``: the profile's value stands)."""

    timeout_s: float = 60.0
    compile_timeout_s: float = 60.0
    cpu_s: float | None = None
    memory_bytes: int = 2 << 30
    pids: int = 512
    cpus: float | None = None
    disk_bytes: int = 2 << 30
    output_bytes: int = 8 << 20
    fetch_bytes: int = 16 << 20


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = field(default_factory=default_workers)  # runs at once
    queue: int = 256  # requests waiting beyond those; more get 429
    token: str | None = None
    caps: Caps = field(default_factory=Caps)
    max_body: int = 32 << 20  # bytes of one request body
    max_pending: int = 256 << 20  # bytes of bodies and answers held at once (read to sent)
    allow_domains: tuple[str, ...] = ()  # the only names a request may ask to reach
    allow_hosts: tuple[str, ...] = ()  # names accepted in Host and Origin besides loopback's
    runs_dir: str | None = None

    def __post_init__(self) -> None:
        # corral.httpauth's rules, as for corral mcp; the token kept without its newline.
        object.__setattr__(self, "token", required(self.token, self.host, "corral serve"))
        if any(not name or name != name.strip().lower() or "/" in name
               for name in self.allow_hosts):
            raise UsageError(f"--allow-host {self.allow_hosts!r} is not a list of host names",
                             "each is a name or address as clients put it in Host, in "
                             "lower case, without a port", "write it like --allow-host "
                             "sandbox.internal")
        if self.max_pending < self.max_body:
            raise UsageError("--max-pending is below --max-body",
                             "a request of the largest size could never be taken",
                             "give --max-pending at least --max-body")
        if self.workers < 1 or self.queue < 0:
            raise UsageError("--workers must be at least 1 and --queue at least 0", "", "")


def cap_request(request: RunRequest, config: Config, *, clamp: bool) -> RunRequest:
    """``request`` within the server's maximums (UsageError, or lowered with ``clamp``), and
    its network rules within the names the server allows."""
    _check_network(request, config)
    caps = config.caps
    wanted = {}
    for f in fields(RequestLimits):
        cap = getattr(caps, f.name)
        asked = getattr(request.limits, f.name)
        if cap is None:
            continue
        if asked is not None and asked > cap and not clamp:
            key = next(k for k, (name, _) in LIMIT_KEYS.items() if name == f.name)
            raise UsageError(f"limits.{key} = {asked:g} is over this server's maximum",
                             f"the server allows at most {cap:g}",
                             f"ask for at most {cap:g}, or leave it out")
        wanted[f.name] = cap if asked is None else min(asked, cap)
    return replace(request, limits=replace(request.limits, **wanted))


def _check_network(request: RunRequest, config: Config) -> None:
    net = request.network
    if net.resolve:
        raise UsageError("a request may not pin names (network.resolve)",
                         "a pin could point the run at this server's own network", "drop it")
    outside = [name for name in net.allow if name not in config.allow_domains]
    if outside:
        allowed = ", ".join(config.allow_domains) or "none"
        raise UsageError(f"network.allow {outside[0]!r} is not allowed by this server",
                         f"names a request may reach: {allowed}",
                         "ask only for those, or start the server with --allow-domain")
