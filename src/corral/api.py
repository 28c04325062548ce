"""The Python API: :func:`run` one command in a fresh sandbox and get a :class:`Result`.

The CLI is a thin layer over this module; both behave the same way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import enforce, guard, host, resolve, workspace
from .bwrap import Sandbox
from .errors import UsageError
from .policy import Policy
from .workspace import Change, RunDir

__all__ = ["Result", "plan", "run"]


@dataclass(frozen=True, slots=True)
class Result:
    """How a run ended and what it left behind.  Output and file names are untrusted."""

    exit_code: int  # the command's own; 128+N for signal N; 124 timeout
    status: str  # exited, signaled, timeout, oom, output-limit, disk-limit
    signal: int | None
    wall_s: float
    cpu_s: float | None
    peak_memory_bytes: int | None
    stdout: bytes | None  # None when output was not captured
    stderr: bytes | None
    truncated: bool  # output went over the cap
    workspace: str
    record: str  # path of the JSON run record
    run_id: str
    changes: tuple[Change, ...] = ()
    changes_truncated: bool = False
    denials: tuple[dict[str, Any], ...] = field(default=())
    unenforced_limits: tuple[str, ...] = ()  # requested, not enforceable here, allowed by name

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object of the command-line contract."""
        def text(data: bytes | None) -> str | None:
            return None if data is None else data.decode("utf-8", errors="replace")

        return {
            "exit_code": self.exit_code, "status": self.status, "signal": self.signal,
            "wall_s": round(self.wall_s, 6), "cpu_s": self.cpu_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "stdout": text(self.stdout), "stderr": text(self.stderr),
            "truncated": self.truncated, "workspace": self.workspace, "record": self.record,
            "run_id": self.run_id, "changes": [c.to_json() for c in self.changes],
            "changes_truncated": self.changes_truncated, "denials": list(self.denials),
            "unenforced_limits": list(self.unenforced_limits),
        }


def _workspace_owner(path: str, facts: host.HostFacts, policy: Policy) -> tuple[int, int]:
    """Started by root with ``--workspace``: the payload runs as the directory's owner."""
    st = os.stat(path)
    uid, gid = resolve.sandbox_identity(policy, facts, st.st_uid)
    if facts.is_root and st.st_uid != uid:
        owner = "root" if st.st_uid == 0 else f"uid {st.st_uid}"
        raise UsageError(
            f"workspace {path} is owned by {owner}, but the command would run as uid {uid}",
            "started by root, corral never runs the payload as root and keeps ownership honest",
            f"chown -R {uid}:{gid} {path}, or pass --user with the directory's owner",
        )
    return uid, gid


def prepare(policy: Policy, *, workspace_dir: str | None, inputs: Sequence[str],
            runs_dir: str | None, facts: host.HostFacts) -> tuple[RunDir, tuple[int, int]]:
    """Validate everything, then create the run directory: nothing exists if this raises."""
    checked = workspace.check_inputs(inputs)
    if workspace_dir is not None:
        ws = guard.check_workspace(workspace_dir)
        ident = _workspace_owner(ws, facts, policy)
    else:
        ws = None
        ident = resolve.sandbox_identity(policy, facts, None)
    facts.require_bwrap()
    owner = ident if facts.is_root else None
    return workspace.prepare(runs_dir or workspace.default_runs_dir(), ws, checked, owner), ident


def plan(cmd: Sequence[str], policy: Policy | None = None, *, workspace_dir: str | None = None,
         inputs: Sequence[str] = (), env: Sequence[tuple[str, str]] = (),
         runs_dir: str | None = None) -> Sandbox:
    """The sandbox :func:`run` would start, checked the same way, creating nothing."""
    policy = policy or Policy()
    facts = host.detect()
    enforce.check(policy, facts)
    workspace.check_inputs(inputs)
    if workspace_dir is not None:
        ws = guard.check_workspace(workspace_dir)
        uid, gid = _workspace_owner(ws, facts, policy)
    else:
        ws = os.path.join(runs_dir or workspace.default_runs_dir(), "RUN-ID", "work")
        uid, gid = resolve.sandbox_identity(policy, facts, None)
    return resolve.resolve_run(policy, list(cmd), facts, ws, uid, gid, env)


def run(cmd: Sequence[str], policy: Policy | None = None, *, workspace_dir: str | None = None,
        inputs: Sequence[str] = (), capture: bool = True, stdin: bytes | None = None,
        env: Sequence[tuple[str, str]] = (), runs_dir: str | None = None) -> Result:
    """Run ``cmd`` in a sandbox and wait for it.

    ``capture`` collects stdout and stderr (capped by ``policy.limits.output_bytes``);
    otherwise they pass through to this process's own.  Raises
    :class:`~corral.errors.CorralError` when the sandbox cannot be set up: then
    the command did not start.
    """
    policy = policy or Policy()
    facts = host.detect()
    cg_plan = enforce.check(policy, facts)  # fail closed before anything is created
    run_dir, (uid, gid) = prepare(policy, workspace_dir=workspace_dir, inputs=inputs,
                                  runs_dir=runs_dir, facts=facts)
    sb = resolve.resolve_run(policy, list(cmd), facts, run_dir.workspace, uid, gid, env)
    before = {} if run_dir.fresh else workspace.snapshot(run_dir.workspace)
    record: dict[str, Any] = {
        "run_id": run_dir.run_id, "command": list(cmd), "profile": policy.name,
        "workspace": run_dir.workspace, "uid": uid, "gid": gid,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "status": "running",
    }
    workspace.write_record(run_dir.record_path, record)
    try:
        bwrap_path = facts.require_bwrap()
        limited = enforce.launch_limited(
            sb, policy, facts, cg_plan, run_dir.run_id, run_dir.workspace, capture=capture,
            stdin=stdin, output_cap=policy.limits.output_bytes, timeout_s=policy.limits.timeout_s,
            bwrap_path=bwrap_path, host_hint=guard.userns_hint(facts))
    except Exception as e:
        record.update(status="error", error=str(e))
        workspace.write_record(run_dir.record_path, record)
        raise
    changes, cut = workspace.collect(run_dir.workspace, before)
    outcome, used = limited.outcome, limited.usage
    result = Result(
        exit_code=outcome.exit_code, status=outcome.status, signal=outcome.signal,
        wall_s=outcome.wall_s, cpu_s=None if used is None else used.cpu_s,
        peak_memory_bytes=None if used is None else used.peak_memory_bytes,
        stdout=outcome.stdout, stderr=outcome.stderr, truncated=outcome.truncated,
        workspace=run_dir.workspace, record=run_dir.record_path, run_id=run_dir.run_id,
        changes=tuple(changes), changes_truncated=cut, unenforced_limits=cg_plan.unenforced,
    )
    record.update(result.to_json(), limits=limited.record)
    record["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    workspace.write_record(run_dir.record_path, record)
    return result

