"""Enforcing one run's limits around a launch: its cgroup, its disk, its watcher, its verdict.

:func:`check` runs before anything of the run exists, so a limit this host
cannot enforce stops the run with nothing created.  :func:`make_image` gives
a fresh workspace its own capped file system where the host allows (see
:mod:`corral.diskimage`); :func:`release_image` copies it out and lets it go,
on every exit path.  :func:`launch_limited` owns the cgroup for the run's
whole life: created and filled with limits before bwrap starts (inside it),
watched while the run lives, emptied, read and removed after, whatever
happened.
"""

from __future__ import annotations

import os

from . import cgroups, limits
from .bwrap import PathHandle, Sandbox
from .cgroups import RunCgroup
from .host import HostFacts
from .launch import Launch, Outcome, limit_exit_code
from .limits import Plan, Usage
from .mountns import ChildMounts
from .policy import Policy
from .record import Record, field
from .watch import Watch

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

    from .diskimage import Image

__all__ = ["Limited", "check", "image_unavailable", "launch_limited", "make_image",
           "release_image"]


class Limited(Record):
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


def image_unavailable(policy: Policy, facts: HostFacts, fresh: bool) -> str | None:
    """Why the run's disk limit will be observed rather than a file system's size, or None.

    A reused ``--workspace`` keeps its place: copying the user's directory into an
    image and back would cost its whole size twice and race with whoever edits it.
    """
    if policy.limits.disk_bytes is None:
        return "no disk limit"
    if not fresh:
        return "a reused workspace (--workspace) is measured, not capped"
    if not facts.is_root:  # what diskimage.unavailable says first, without its import
        return "only root may mount a file system image"
    from . import diskimage

    return diskimage.unavailable(facts.is_root)


def make_image(run_root: str, capacity: int, owner: tuple[int, int]) -> tuple[Image | None, str]:
    """A fresh workspace's file system, free space ``capacity`` at least, or (None, why)."""
    from . import diskimage

    image = diskimage.Image(os.path.join(run_root, "work.img"), capacity, owner,
                            diskimage.templates_dir())
    try:
        image.create()
    except OSError as e:  # mke2fs failing too (corral.diskimage._format)
        image.discard()
        return None, f"the workspace image could not be made ({e})"
    except BaseException:  # a signal while mke2fs ran: nothing of the run is in it yet
        image.discard()
        raise
    return image, ""


def release_image(image: Image, workspace: str) -> dict[str, object]:
    """After the run: copy the image's tree into ``workspace``, let go, say how it went."""
    try:
        image.export(workspace)
    finally:
        image.close()
    return image.describe()


def _child_mounts(image: Image | None, workspace: str) -> ChildMounts | None:
    """The image moved over the workspace in bwrap's private namespace (root only; the
    launcher adds a sandbox's bounded devpts itself)."""
    if image is None or image.mount_fd is None:
        return None
    mounts = ChildMounts(own_userns=False)
    mounts.move(image.mount_fd, workspace)
    return mounts


def launch_limited(sb: Sandbox, policy: Policy, facts: HostFacts, plan: Plan, run_id: str,
                   workspace: str, image: Image | None = None, disk_why: str = "",
                   **launch_args: Any) -> Limited:
    """Launch ``sb`` (see :class:`~corral.launch.Launch` for ``launch_args``) within its limits.

    ``image``, when given, is mounted at ``workspace`` for the run (its caller
    releases it afterwards); ``disk_why`` says why there is none.
    """
    lim = policy.limits
    cgroup = RunCgroup(plan, run_id) if plan.bases else None
    run: Launch | None = None

    def processes() -> list[int]:  # without a cgroup: everything below bwrap
        from .diskuse import descendants

        return descendants(run.proc.pid) if run is not None and run.proc is not None else []

    watch = Watch(workspace=workspace, disk_bytes=lim.disk_bytes, cpu_s=lim.cpu_s,
                  pids=cgroup.pids if cgroup else processes,
                  cpu_used=cgroup.cpu_s if cgroup else None, restore=not facts.is_root,
                  image=image)
    preset = ({PathHandle(workspace): image.mount_fd}
              if image is not None and image.mount_fd is not None else None)
    used: Usage | None = None
    try:
        if cgroup is not None:
            cgroup.create()
        watch.start()
        run = Launch(sb, cgroup=cgroup, watch=watch, preset=preset,
                     mounts=_child_mounts(image, workspace), **launch_args)
        try:
            run.start()
            outcome = run.supervise()
        finally:
            run.close()
    finally:
        watch.stop()
        if cgroup is not None:
            used = cgroup.close()
    outcome.status = limits.verdict(outcome.status, outcome.exit_code, used)
    own_code: int | None = None
    if outcome.status in ("exited", "signaled"):
        # A limit crossed in the last moments, after the loop's last look: the disk's use,
        # the CPU time.  The exit status is the limit's, as when corral ends the run (a
        # caller reading only it must not take the run for a success); the command's own
        # goes in the record.
        late = watch.finish(used.cpu_s if used is not None else None)
        if late is not None:
            own_code, outcome.status = outcome.exit_code, late
            outcome.exit_code = limit_exit_code(late)
    record = _record(plan, cgroup, watch, used)
    if own_code is not None:
        record["command_exit_code"] = own_code
    if lim.disk_bytes is not None and disk_why:
        record["disk_enforcement_why"] = disk_why
    record["ptys"] = sb.ptys
    return Limited(outcome, used, record)


def _record(plan: Plan, cgroup: RunCgroup | None, watch: Watch, used: Usage | None
            ) -> dict[str, Any]:
    out: dict[str, Any] = {"unenforced": list(plan.unenforced), **watch.describe()}
    if cgroup is not None:
        out.update(cgroup.describe())
    if used is not None:
        out.update(oom_kills=used.oom_kills, pids_peak=used.pids_peak,
                   pids_refused=used.pids_refused)
    return out
