"""Run one :class:`~corral.request.RunRequest` with the one launcher, :func:`corral.api.run`.

The steps, each on every path:

1. the policy: the request's profile (or its language's), with the request's limits,
   network rules and environment on top; nothing a request says can add a relaxation;
2. the request's files (and its code) are written into a private staging directory of the
   launcher's own, and copied into the fresh workspace by :func:`corral.api.run` as inputs;
3. for c and cpp, a compile step runs in its own sandbox with the compile timeout; the run
   then reuses that workspace;
4. the files the request asks back are read through :mod:`corral.fsops` (never through a
   link, never a FIFO or a device, capped);
5. the request's run directories (workspaces and records) are removed, also through
   :mod:`corral.fsops`, unless the caller keeps them.

Engines call :func:`run_request`; it never raises for a bad request or a sandbox that
cannot start: those are results with status ``invalid`` or ``error``.  :func:`run_in` runs a
request the same way in a workspace that outlives it (an MCP session's, see
:mod:`corral.mcp`), under its caller's fixed policy: steps 3 and 4 as above, but the files
are written into that workspace through :mod:`corral.fsops` and nothing is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from . import api, fsops, workspace
from .errors import CorralError, UsageError
from .policy import Network, Policy
from .profiles import load_profile, profile_for_command
from .record import replace
from .request import Fetched, RequestLimits, RunRequest
from .result import RunResult

__all__ = ["DEFAULT_FETCH_BYTES", "capped", "policy_for", "run_in", "run_request"]

DEFAULT_FETCH_BYTES = 16 << 20  # fetched files of one request, in all, unless it asks


def policy_for(request: RunRequest) -> Policy:
    """The policy ``request`` runs under (its run step); UsageError if it cannot be built."""
    spec = request.language_spec
    name = request.profile or (spec.profile if spec else
                               profile_for_command(request.command or ()))
    policy = load_profile(name)
    lim = request.limits
    wanted: dict[str, Any] = {
        "timeout_s": lim.timeout_s, "cpu_s": lim.cpu_s, "memory_bytes": lim.memory_bytes,
        "pids": lim.pids, "cpus": lim.cpus, "disk_bytes": lim.disk_bytes,
        "output_bytes": lim.output_bytes}
    limits = replace(policy.limits, **{k: v for k, v in wanted.items() if v is not None})
    net = request.network
    network = replace(policy.network, allow=policy.network.allow + net.allow,
                      deny=policy.network.deny + net.deny,
                      resolve=policy.network.resolve + net.resolve)
    return replace(policy, limits=limits, network=network)


def run_request(request: RunRequest, *, runs_dir: str | None = None,
                keep: bool = False) -> RunResult:
    """Run ``request`` in fresh sandboxes and return what it gave back; see the module doc.

    ``runs_dir`` is where its run directories go (default: corral's); with ``keep`` they
    stay there, and the results' ``workspace`` and ``record`` point at them.
    """
    try:
        policy = policy_for(request)
    except UsageError as e:
        return RunResult.refused(request.id, "invalid", str(e))
    base = runs_dir or workspace.default_runs_dir()

    def fresh() -> RunResult:
        with _request_dir(base, keep) as own_runs, _staged(request) as inputs:
            return _steps(request, policy, own_runs, inputs, keep)

    return _refusing(request, fresh)


# A request's limits that a front end's maximums cap (RequestLimits and Limits share names).
CAPPED = ("timeout_s", "cpu_s", "memory_bytes", "pids", "cpus", "disk_bytes", "output_bytes")


def capped(policy: Policy, limits: RequestLimits) -> Policy:
    """``policy`` with each limit that ``limits`` names lowered to it, never raised: the
    policy's limits are the maximums, and a request can only tighten them."""
    lowered: dict[str, Any] = {}
    for name in CAPPED:
        asked, most = getattr(limits, name), getattr(policy.limits, name)
        if asked is not None:
            lowered[name] = asked if most is None else min(asked, most)
    return replace(policy, limits=replace(policy.limits, **lowered))


def run_in(request: RunRequest, policy: Policy, workspace_dir: str, *,
           owner: tuple[int, int] | None, runs_dir: str) -> RunResult:
    """Run ``request`` in the existing workspace ``workspace_dir`` (an MCP session's).

    The policy is the caller's, fixed: the request's limits can only lower it
    (:func:`capped`, the compile timeout too), and a request that names a profile or
    network rules is refused.  Its files and code are written into the workspace through
    :mod:`corral.fsops` as ``owner`` (root: the payload's uid), replacing files of the same
    names; nothing is removed afterwards, and the run records go to ``runs_dir``.
    """
    if request.profile is not None or request.network != Network():
        return RunResult.refused(request.id, "invalid", str(UsageError(
            "this request may not name a profile or network rules",
            "it runs under its front end's policy, fixed when the front end started",
            "leave them out; the server's operator sets them")))
    policy = capped(policy, request.limits)
    most = policy.limits.timeout_s
    asked = request.limits.compile_timeout_s
    if asked is not None and most is not None and asked > most:
        request = replace(request, limits=replace(request.limits, compile_timeout_s=most))

    def there() -> RunResult:
        with fsops.Tree(workspace_dir, owner) as tree:
            _place(tree, _contents(request))
        return _steps(request, policy, runs_dir, [], True, workspace_dir)

    return _refusing(request, there)


def _refusing(request: RunRequest, steps: Callable[[], RunResult]) -> RunResult:
    """``steps()``, with every way corral can refuse turned into a result, never raised."""
    try:
        return steps()
    except UsageError as e:
        return RunResult.refused(request.id, "invalid", str(e))
    except CorralError as e:
        return RunResult.refused(request.id, "error", str(e))
    except OSError as e:
        return RunResult.refused(request.id, "error",
                                 f"corral could not run the request; {e.strerror or e}")


def _place(tree: fsops.Tree, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` into a workspace a payload has used: never through a link."""
    for rel, content in files:
        try:
            if "/" in rel:
                tree.makedirs(rel.rsplit("/", 1)[0])
            tree.write(rel, content, 0o644)
        except OSError as e:
            raise UsageError(f"cannot write {rel!r} into the workspace", fsops.reason(e),
                             "remove or rename what is in the way first") from None


def _contents(request: RunRequest) -> list[tuple[str, bytes]]:
    """The files a request places: its ``files``, and its code under the language's name."""
    files = list(request.files)
    spec = request.language_spec
    if spec is not None and request.code is not None:
        files.append((spec.source, request.code.encode("utf-8", errors="surrogatepass")))
    return files


def _steps(request: RunRequest, policy: Policy, runs: str, inputs: list[str],
           keep: bool, workspace_dir: str | None = None) -> RunResult:
    # Every workspace reused here is corral's own (the compile step's, or run_in's session
    # workspace), never one the user named: own_workspace.
    spec = request.language_spec
    env = request.env
    compiled = None
    if spec is not None and spec.compile is not None:
        timeout = request.limits.compile_timeout_s or policy.limits.timeout_s
        compile_policy = replace(policy, limits=replace(policy.limits, timeout_s=timeout))
        compiled = api.run(spec.compile, compile_policy, inputs=inputs, env=env, runs_dir=runs,
                           workspace_dir=workspace_dir, own_workspace=True)
        if not compiled.ok:  # a dead init is corral's error, not a failed compile
            status = "error" if compiled.status == "error" else "compile-failed"
            return RunResult(request.id, status, compile=_shown(compiled, keep),
                             error=compiled.error)
    argv = spec.run if spec is not None else request.command or ()
    ran = api.run(argv, policy, inputs=() if compiled else inputs, env=env, runs_dir=runs,
                  stdin=request.stdin, own_workspace=True,
                  workspace_dir=compiled.workspace if compiled else workspace_dir)
    files = fetch(ran.workspace, request.fetch, request.limits.fetch_bytes or
                  DEFAULT_FETCH_BYTES)
    return RunResult(request.id, ran.status, run=_shown(ran, keep),
                     compile=None if compiled is None else _shown(compiled, keep), files=files,
                     error=ran.error)


def _shown(result: api.Result, keep: bool) -> api.Result:
    """A removed run's Result does not point at paths that no longer exist."""
    return result if keep else replace(result, workspace="", record="")


@contextlib.contextmanager
def _request_dir(base: str, keep: bool) -> Iterator[str]:
    """A directory of this request's own under the runs directory: its run directories go
    there, and all of it goes when the request is done, however it ended."""
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        path = tempfile.mkdtemp(prefix="req-", dir=base)
    except OSError as e:
        raise UsageError(f"cannot create a run directory in {base}", e.strerror or str(e),
                         "pass --runs-dir DIR or set CORRAL_RUNS_DIR to a writable "
                         "directory") from None
    try:
        yield path
    finally:
        if not keep:
            fsops.remove_tree(path)


@contextlib.contextmanager
def _staged(request: RunRequest) -> Iterator[list[str]]:
    """The request's files (and code) in a private directory of the launcher's: the
    top-level entries, to pass as inputs.  Nothing a payload can reach, so plain paths."""
    files = _contents(request)
    if not files:
        yield []
        return
    stage = tempfile.mkdtemp(prefix="corral-stage-")
    try:
        for rel, content in files:
            path = os.path.join(stage, rel)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content)
        yield sorted(os.path.join(stage, name) for name in os.listdir(stage))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def fetch(where: str, paths: tuple[str, ...], budget: int) -> tuple[Fetched, ...]:
    """The files ``paths`` of the workspace ``where``, ``budget`` bytes in all.

    The workspace is the payload's: read through :class:`corral.fsops.Tree`, as its owner.
    """
    if not paths:
        return ()
    owner = None
    if os.geteuid() == 0:
        st = os.stat(where)
        owner = (st.st_uid, st.st_gid)
    out = []
    with fsops.Tree(where, owner) as tree:
        for rel in paths:
            content, reason = _read(tree, rel, budget)
            budget -= len(content or b"")
            out.append(Fetched(rel, content, reason))
    return tuple(out)


def _read(tree: fsops.Tree, rel: str, budget: int) -> tuple[bytes | None, str | None]:
    try:
        content = tree.read(rel, max(budget, 0))
    except OSError as e:
        reasons = {errno.EFBIG: f"over the fetch limit ({max(budget, 0)} bytes left)",
                   errno.ELOOP: "a symbolic link is on the way", errno.EXDEV: "leaves the "
                   "workspace", errno.ENOTDIR: "missing"}
        return None, reasons.get(e.errno or 0, e.strerror or str(e))
    if content is None:
        return None, "missing, or not a regular file"
    return content, None
