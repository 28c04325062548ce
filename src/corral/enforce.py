"""Enforcing one run's limits around a launch: its cgroup, its watcher, its verdict.

:func:`check` runs before anything of the run exists, so a limit this host
cannot enforce stops the run with nothing created; :func:`launch_limited`
owns the cgroup for the run's whole life: created and filled with limits
before bwrap starts (inside it), watched while the run lives, emptied, read
and removed after, whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import cgroups, limits
from .bwrap import Sandbox
from .cgroups import RunCgroup
from .host import HostFacts
from .launch import Launch, Outcome
from .limits import Plan, Usage
from .policy import Policy
from .watch import Watch

__all__ = ["Limited", "check", "launch_limited"]


@dataclass(slots=True)
class Limited:
    """A run's outcome with what its cgroup counted and what the record should say."""

    outcome: Outcome
    usage: Usage | None
    record: dict[str, Any] = field(default_factory=dict)


def check(policy: Policy, facts: HostFacts) -> Plan:
    """The cgroup plan for ``policy`` here; raises HostError for an unenforceable limit."""
    if not limits.requested(policy.limits):
        return Plan(None, (), ())  # no cgroup wanted: do not even probe
    access = cgroups.probe(facts)
    return limits.plan(policy.limits, access, policy.allow.unenforced_limits)


def launch_limited(sb: Sandbox, policy: Policy, facts: HostFacts, plan: Plan, run_id: str,
                   workspace: str, **launch_args: Any) -> Limited:
    """Launch ``sb`` (see :class:`~corral.launch.Launch` for ``launch_args``) within its limits."""
    lim = policy.limits
    cgroup = RunCgroup(plan, run_id) if plan.bases else None
    watch = Watch(workspace=workspace, disk_bytes=lim.disk_bytes, cpu_s=lim.cpu_s,
                  pids=cgroup.pids if cgroup else None,
                  cpu_used=cgroup.cpu_s if cgroup else None, restore=not facts.is_root)
    used: Usage | None = None
    try:
        if cgroup is not None:
            cgroup.create()
        watch.start()
        run = Launch(sb, cgroup=cgroup, watch=watch, **launch_args)
        try:
            run.start()
            outcome = run.supervise()
        finally:
            run.close()
    finally:
        if cgroup is not None:
            used = cgroup.close()
    outcome.status = limits.verdict(outcome.status, outcome.exit_code, used)
    if outcome.status in ("exited", "signaled") and watch.finish() == "disk-limit":
        outcome.status = "disk-limit"  # crossed in the last moments; the code stays its own
    return Limited(outcome, used, _record(plan, cgroup, watch, used))


def _record(plan: Plan, cgroup: RunCgroup | None, watch: Watch, used: Usage | None
            ) -> dict[str, Any]:
    out: dict[str, Any] = {"unenforced": list(plan.unenforced), **watch.describe()}
    if cgroup is not None:
        out.update(cgroup.describe())
    if used is not None:
        out.update(oom_kills=used.oom_kills, pids_peak=used.pids_peak,
                   pids_refused=used.pids_refused)
    return out
