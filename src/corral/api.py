"""The Python API: :func:`run` one command in a fresh sandbox and get a :class:`Result`.

The CLI is a thin layer over this module; both behave the same way.
"""

from __future__ import annotations

import os
import sys
import time

from . import audit, cinit, egress, enforce, fsops, guard, host, pending, resolve, workspace
from .bwrap import Sandbox
from .enforce import Limited
from .errors import CorralError, Interrupted, UsageError
from .launch import CORRAL_FAILED
from .limits import Plan
from .policy import Policy
from .record import Record, field
from .workspace import Change, RunDir

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:  # and imported where used: `corral run` pays for neither (bench/floor.py)
    from collections.abc import Callable, Sequence
    from contextlib import ExitStack
    from typing import Any, overload

    from . import agent
    from .diskimage import Image
    from .request import RunRequest
    from .result import RunResult
else:
    def overload(f: object) -> object:  # typing's, for mypy only (ruff: F811 below)
        return f

__all__ = ["Result", "plan", "plan_agent", "run", "run_agent"]


class Result(Record, frozen=True):
    """How a run ended and what it left behind.  Output and file names are untrusted."""

    exit_code: int  # the command's own; 128+N for signal N; 124 timeout; 125 error
    status: str  # exited, signaled, timeout, oom, output-limit, disk-limit, error
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
    notes: tuple[str, ...] = ()  # what corral undid or noticed after the run, in words
    audit: tuple[dict[str, str], ...] = ()  # the same, as data (see corral.audit.Action)
    unenforced_limits: tuple[str, ...] = ()  # requested, not enforceable here, allowed by name
    error: str | None = None  # status "error": corral lost sight of the run (one line)

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
            "notes": list(self.notes), "audit": list(self.audit),
            "unenforced_limits": list(self.unenforced_limits), "error": self.error,
        }


def _workspace_owner(path: str, facts: host.HostFacts, policy: Policy) -> tuple[int, int]:
    """Started by root with ``--workspace``: the payload runs as the directory's owner
    (the directory as held, when the caller holds it: see corral.fsops.open_held)."""
    st = fsops.stat_held(path)
    uid, gid = resolve.sandbox_identity(policy, facts, st.st_uid)
    if facts.is_root and st.st_uid != uid:
        owner = "root" if st.st_uid == 0 else f"uid {st.st_uid}"
        raise UsageError(
            f"workspace {path} is owned by {owner}, but the command would run as uid {uid}",
            "started by root, corral never runs the payload as root and keeps ownership honest",
            f"chown -R {uid}:{gid} {path}, or pass --user with the directory's owner",
        )
    return uid, gid


def _check_owners_way(given: str, held: str, policy: Policy) -> None:
    """Started by root with ``--workspace`` and no ``--user``, the payload runs as the
    folder's owner: every folder on the way to it as given (each link's folder and its
    target's) must be that owner's or root's, written by no one else, so that no third
    user sent the path to a folder of someone else's through a link of theirs (review 42).
    ``held`` is the folder as locked (corral.workspace.held): its owner is read there."""
    if os.geteuid() != 0 or policy.user is not None:
        return
    workspace.check_way(given, fsops.stat_held(held).st_uid, f"workspace {given}",
                        "started by root, corral runs the payload as the workspace's owner",
                        "name the folder by a path through its owner's and root's folders "
                        "only, or pass --user")


def prepare(policy: Policy, *, workspace_dir: str | None, inputs: Sequence[str],
            runs_dir: str | None, facts: host.HostFacts, own_workspace: bool = False
            ) -> tuple[RunDir, tuple[int, int]]:
    """Validate everything, then create the run directory (and copy ``inputs`` in): nothing
    exists if this raises."""
    checked = workspace.check_inputs(inputs)
    if workspace_dir is not None:
        # Checked again, but used as the caller held it: a name resolved now could lead
        # elsewhere (review 42), the held path is reached through its lock's descriptor.
        guard.check_workspace(workspace_dir, own_workspace)
        ws = workspace_dir
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
    wants_network = _check_network(policy)
    enforce.check(policy, facts)
    workspace.check_inputs(inputs)
    if workspace_dir is not None:
        ws = guard.check_workspace(workspace_dir)
        _check_owners_way(workspace_dir, ws, policy)
        uid, gid = _workspace_owner(ws, facts, policy)
    else:
        ws = os.path.join(runs_dir or workspace.default_runs_dir(), "RUN-ID", "work")
        uid, gid = resolve.sandbox_identity(policy, facts, None)
    sb = resolve.resolve_run(policy, list(cmd), facts, ws, uid, gid, env)
    return egress.attach(sb, _planned_bridge(policy)) if wants_network else sb


def _planned_bridge(policy: Policy) -> egress.Bridge:
    return egress.plan_bridge(egress.compile_rules(policy.network))


def _check_network(policy: Policy) -> bool:
    """Validate the egress rules (UsageError before anything exists); whether any name is
    allowed, so that a proxy must start."""
    net = policy.network
    return bool((net.allow or net.deny or net.resolve) and egress.compile_rules(net).enabled)


@overload
def run(cmd: RunRequest, policy: None = None, *, runs_dir: str | None = None) -> RunResult: ...


@overload
def run(cmd: Sequence[str], policy: Policy | None = None, *, workspace_dir: str | None = None,  # noqa: F811
        inputs: Sequence[str] = (), capture: bool = True, stdin: bytes | None = None,
        env: Sequence[tuple[str, str]] = (), runs_dir: str | None = None,
        own_workspace: bool = False) -> Result: ...


def run(cmd: Sequence[str] | RunRequest, policy: Policy | None = None, *,  # noqa: F811
        workspace_dir: str | None = None, inputs: Sequence[str] = (), capture: bool = True,
        stdin: bytes | None = None, env: Sequence[tuple[str, str]] = (),
        runs_dir: str | None = None, own_workspace: bool = False) -> Result | RunResult:
    """Run ``cmd`` in a sandbox and wait for it.

    ``capture`` collects stdout and stderr (capped by ``policy.limits.output_bytes``);
    otherwise they pass through to this process's own.  ``own_workspace`` says that
    ``workspace_dir`` is one corral made for earlier runs (a compile step's, an MCP
    session's), so folders named like credentials in it are its payloads' (see
    :func:`corral.guard.check_workspace`).  Raises
    :class:`~corral.errors.CorralError` when the sandbox cannot be set up: then
    the command did not start.

    Given a :class:`~corral.request.RunRequest` instead (and no other argument but
    ``runs_dir``), runs it with :func:`corral.execute.run_request` and returns its
    :class:`~corral.result.RunResult`, which never raises for a bad request.
    """
    from .errors import children_seen, standard_streams

    standard_streams()
    children_seen()
    requests = sys.modules.get("corral.request")  # not imported: cmd cannot be a RunRequest
    if requests is not None and isinstance(cmd, requests.RunRequest):
        if policy is not None or workspace_dir or inputs or not capture or stdin or env:
            raise UsageError("a RunRequest is run with runs_dir alone",
                             "it carries its own profile, limits, files, stdin and env",
                             "put them in the request")
        from .execute import run_request

        return run_request(cmd, runs_dir=runs_dir)
    argv: Sequence[str] = cmd  # type: ignore[assignment]  # what isinstance narrowed it to
    # A reused workspace is one run's at a time, and no other sandbox writes in it or
    # above it: another run's launch census would back up this one's plant, and its audit
    # put it back after ours had quarantined it (reviews 4 and 5).
    # The run then uses the folder as locked, resolved once (review 6 repointed a link on
    # the way between two resolutions).
    runs = runs_dir or workspace.default_runs_dir()
    workspace.check_runs_dir(runs)  # before its pending audits are read (recover)
    if workspace_dir:
        guard.check_workspace(workspace_dir, own_workspace)  # its refusals come first
        workspace.check_runs_apart(runs, [workspace_dir])
    # What it reads or writes by path is held too: inputs copied in, --ro paths, the runs
    # directory (review 7).
    reads = [*inputs, *(policy.read_only if policy is not None else ()), runs]
    # What runs whose corral was SIGKILLed left unaudited, before the census takes it in
    # (as agent mode does; the workspace is not held yet: recovering holds it itself).
    recovered = pending.recover(runs, [workspace_dir]) if workspace_dir else []
    with workspace.held([workspace_dir] if workspace_dir else [], reads) as trees:
        if workspace_dir:
            _check_owners_way(workspace_dir, trees[0], policy or Policy())
        inputs = [workspace.settled(p) for p in workspace.check_inputs(inputs)]
        return _run_command(argv, policy or Policy(), trees[0] if trees else None, inputs,
                            capture, stdin, env, runs_dir, own_workspace, recovered)


def _run_command(argv: Sequence[str], policy: Policy, workspace_dir: str | None,
                 inputs: Sequence[str], capture: bool, stdin: bytes | None,
                 env: Sequence[tuple[str, str]], runs_dir: str | None, own_workspace: bool,
                 recovered: Sequence[audit.Action] = ()) -> Result:
    _check_env(env)  # bad variables: refused before anything is created
    facts = host.detect()
    _check_network(policy)  # bad rules: refused before anything is created
    cg_plan = enforce.check(policy, facts)  # fail closed before anything is created
    init = cinit.choice()  # a bad CORRAL_INIT, or the compiled init asked for and not built
    disk_why = enforce.image_unavailable(policy, facts, fresh=workspace_dir is None)
    later = workspace.check_inputs(inputs) if disk_why is None else []  # into the image
    run_dir, (uid, gid) = prepare(policy, workspace_dir=workspace_dir,
                                  inputs=inputs if disk_why is not None else (),
                                  runs_dir=runs_dir, facts=facts, own_workspace=own_workspace)
    # The run's own folder is held while it lives, like any tree a sandbox writes.
    with workspace.claimed(run_dir.root):
        image = None
        if disk_why is None:
            image, disk_why = _stage(run_dir, policy, later, (uid, gid))
        sb = resolve.resolve_run(policy, list(argv), facts, run_dir.workspace, uid, gid, env,
                                 init=init)
        before = {} if run_dir.fresh else workspace.snapshot(run_dir.workspace)
        owner = (uid, gid) if facts.is_root else None
        names = audit.protected_names(policy.protect)
        census = audit.Census(((run_dir.workspace, owner),), names) if run_dir.fresh else \
            audit.census_of_tree(run_dir.workspace, owner, names)
        record: dict[str, Any] = {
            "run_id": run_dir.run_id, "command": list(argv), "profile": policy.name,
            "workspace": run_dir.workspace, "uid": uid, "gid": gid, "init": _init_name(sb),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "status": "running",
        }
        workspace.write_record(run_dir.record_path, record)
        actions: list[audit.Action] = list(recovered)
        exported: dict[str, object] = {}
        # A reused workspace's census is owed until its audit has run to its end: a corral
        # killed outright (SIGKILL, the OOM killer) leaves it for the next launch with the
        # same runs directory (pending.recover above), as in agent mode.
        owed = None if run_dir.fresh else pending.owe(
            runs_dir or workspace.default_runs_dir(), run_dir.run_id, census, run_dir.root,
            [run_dir.workspace])
        try:
            with audit.audited(census, workspace.quarantine(run_dir.root), actions,
                               done=lambda: pending.settle(owed)):
                try:
                    limited, denials, record["egress_log"] = _execute(
                        sb, policy, facts, cg_plan, run_dir.run_id, run_dir.workspace,
                        run_dir.root, capture, stdin, image, disk_why)
                finally:  # every exit path: the run's files land in RUNS/<id>/work
                    if image is not None:
                        with audit.signals_held():  # a signal now must not cut the copy short
                            exported = enforce.release_image(image, run_dir.workspace)
                changes, cut = workspace.collect(run_dir.workspace, before)
        except BaseException as e:
            raise _unwound(e, {**record, **_left(run_dir, before), "limits": exported},
                           run_dir.record_path, actions) from None
        result = _result(limited, denials, cg_plan, actions, workspace=run_dir.workspace,
                         record=run_dir.record_path, run_id=run_dir.run_id,
                         changes=tuple(changes), changes_truncated=cut)
        record.update(result.to_json(), limits={**limited.record, **exported})
        record["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        workspace.write_record(run_dir.record_path, record)
        return result


def _init_name(sb: Sandbox) -> str:
    """Which init the run gets (corral.cinit)."""
    return "c" if sb.init_binary is not None else "python"


def _check_env(env: Sequence[tuple[str, str]]) -> None:
    """Variables for the payload: a name without ``=``, and no NUL byte anywhere (the
    init's config ends a record at a NUL: what follows must never become a setting)."""
    for name, value in env:
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise UsageError(f"environment variable {name!r} cannot be given to the payload",
                             "a name must be non-empty without '=', and neither name nor "
                             "value may hold a NUL byte", "fix or drop the variable")


def _stage(run_dir: RunDir, policy: Policy, inputs: Sequence[str], owner: tuple[int, int]
           ) -> tuple[Image | None, str]:
    """Started by root, a fresh workspace with a disk limit: its image (or, when the host
    will not make one, the plain directory, measured instead), with the inputs in it."""
    assert policy.limits.disk_bytes is not None
    capacity = policy.limits.disk_bytes + workspace.input_bytes(inputs)
    image, why = enforce.make_image(run_dir.root, capacity, owner)
    try:
        root = image.root() if image is not None else os.open(run_dir.workspace,
                                                              workspace.DIR_FLAGS)
        with fsops.Tree(run_dir.workspace, owner, root) as tree:
            for src in inputs:
                workspace.copy_in(tree, src)
    except BaseException:
        if image is not None:
            image.discard()
        raise
    return image, why


def _left(run_dir: RunDir, before: dict[str, Any]) -> dict[str, Any]:
    """For the record of a run that did not end normally: what it left in its workspace."""
    try:
        changes, cut = workspace.collect(run_dir.workspace, before)
    except Exception as e:  # the record is still written; it says why the list is missing
        return {"changes": [], "changes_error": str(e)}
    return {"changes": [c.to_json() for c in changes], "changes_truncated": cut}


def _unwound(e: BaseException, record: dict[str, Any], path: str | None,
             actions: list[audit.Action]) -> BaseException:
    """The exception to pass on after a run that did not end normally (audited by then):
    the record says how it ended and what the audit did; a CorralError and an
    interruption carry the audit's lines for the CLI to print."""
    lines = tuple(a.line() for a in actions)
    interrupted = isinstance(e, KeyboardInterrupt | Interrupted)
    if path is not None:
        workspace.write_record(path, {**record, "status": "interrupted" if interrupted
                                      else "error", "error": str(e),
                                      "audit": [a.to_json() for a in actions],
                                      "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                             time.gmtime())})
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(2, lines)
    if isinstance(e, Interrupted | CorralError):
        e.notes = lines
    else:  # a bug in corral: its traceback shows what the audit did all the same
        for line in lines:
            e.add_note(f"corral: the audit after the failure: {line}")
    return e


def plan_agent(cmd: Sequence[str], policy: Policy, *, project: str,
               env: Sequence[tuple[str, str]] = ()) -> tuple[Sandbox, agent.Layout]:
    """The sandbox :func:`run_agent` would start in ``project``, creating nothing."""
    wants_network = _check_network(policy)
    from . import agent

    sb, layout = agent.resolve_agent(policy, list(cmd), host.detect(), project, env)
    return (egress.attach(sb, _planned_bridge(policy)) if wants_network else sb), layout


def run_agent(cmd: Sequence[str], policy: Policy, *, project: str, capture: bool = False,
              stdin: bytes | None = None, env: Sequence[tuple[str, str]] = (),
              runs_dir: str | None = None, record: bool = True, import_state: bool = False,
              announce: Callable[[Sandbox, agent.Layout], None] | None = None) -> Result:
    """Run a coding agent (or one shell command) in ``project``; see :mod:`corral.agent`.

    With ``record``, a run record (no file listing: the project is the user's)
    goes under the runs directory.  ``import_state`` copies the agent's state into
    corral's private copy again (see :mod:`corral.agent.state`).  ``announce`` sees the
    sandbox just before launch.
    """
    from . import agent
    from .errors import children_seen, standard_streams

    standard_streams()
    children_seen()
    _check_env(env)
    facts = host.detect()
    _check_network(policy)  # bad rules: refused before anything is created
    cg_plan = enforce.check(policy, facts)  # fail closed before anything is created
    init = cinit.choice()  # once per run: resolve_agent is handed the answer
    resolve.probe_ptys(policy, facts, init)  # answered by the time resolve_agent asks
    runs = runs_dir or workspace.default_runs_dir()
    workspace.check_runs_dir(runs)  # before its pending audits are read (recover)
    # What runs whose corral was SIGKILLed left unaudited, before this scan takes it in.
    # Never from a runs directory a sandbox of this launch could write (found by review:
    # a profile's ~/ path was compared unexpanded).
    # Who the agent would be can be refused (root in a folder root owns): then nothing is
    # recovered now, and resolve_agent refuses the launch in its own words, its checks in
    # their own order (the owed audits stay owed, untouched).
    try:
        writable: list[str] | None = agent.writable_paths(policy, facts, project)
    except CorralError:
        writable = None
    actions: list[audit.Action] = pending.recover(runs, writable) if writable is not None else []
    # The CLI's proxy process, forked now: it imports the proxy while the run is prepared
    # (no name allowed: not even egress.session is imported).
    early = egress.prefork(policy.network, cpu_share=policy.limits.cpus) \
        if policy.network.allow else None
    # The user's trees this sandbox writes, held from before the launch scan to after the
    # audit: no other corral run's sandbox writes in them meanwhile (corral.workspace.held).
    import contextlib  # ExitStack: agent mode only (corral.small says why)

    stack = contextlib.ExitStack()
    try:
        try:
            sb, layout = agent.resolve_agent(
                policy, list(cmd), facts, project, env, prepare=True,
                import_state=import_state, init=init,
                hold=lambda trees, reads: _hold(stack, runs, trees, reads))
        except CorralError as e:
            e.notes = tuple(a.line() for a in actions)
            raise
        if announce is not None:
            announce(sb, layout)
        run_dir = workspace.record_dir(runs_dir or workspace.default_runs_dir(), layout.project) \
            if record else None
        entry: dict[str, Any] = {
            "command": list(cmd), "profile": policy.name, "project": layout.project,
            "uid": sb.uid, "gid": sb.gid, "status": "running", "init": _init_name(sb),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if run_dir is not None:
            entry["run_id"] = run_dir.run_id
            workspace.write_record(run_dir.record_path, entry)
        owner = (sb.uid, sb.gid) if facts.is_root else None
        census = audit.census_of_findings(  # the user's trees; not corral's copy of the state
            [(e.path, owner) for e in layout.writable if e.kind == "dir" and not e.source],
            layout.findings, audit.protected_names(policy.protect), layout.hooks,
            layout.watched)
        quarantine = workspace.quarantine(
            run_dir.root if run_dir else None, runs, layout.project)
        run_id = run_dir.run_id if run_dir else workspace.new_run_id()
        owed = pending.owe(runs, run_id, census, run_dir.root if run_dir else None,
                           [*(e.path for e in layout.writable),
                            *(e.source for e in layout.writable if e.source)])
        try:
            # The census owed is settled once the audit has run to its end, however the
            # run ended; an audit cut short leaves it for the next launch to redo.
            with audit.audited(census, quarantine, actions, done=lambda: pending.settle(owed)):
                limited, denials, entry["egress_log"] = _execute(
                    sb, policy, facts, cg_plan, run_id, layout.project,
                    run_dir.root if run_dir else None, capture, stdin, early=early)
        except BaseException as e:
            raise _unwound(e, entry, run_dir.record_path if run_dir else None, actions) from None
        result = _result(limited, denials, cg_plan, actions, workspace=layout.project,
                         record=run_dir.record_path if run_dir else "",
                         run_id=run_dir.run_id if run_dir else "")
        if run_dir is not None:
            workspace.write_record(run_dir.record_path, {
                **entry, **result.to_json(), "limits": limited.record,
                "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return result
    finally:
        stack.close()
        if early is not None:
            early.discard()


def _hold(stack: ExitStack, runs: str, trees: Sequence[str],
          reads: Sequence[str]) -> None:
    """An agent's trees held (corral.workspace.held), its runs directory apart from them
    and held like what it reads."""
    workspace.check_runs_apart(runs, trees)  # (check_runs_dir: run_agent's start)
    stack.enter_context(workspace.held(trees, [*reads, runs]))


def _result(limited: Limited, denials: tuple[dict[str, Any], ...], cg_plan: Plan,
            actions: Sequence[audit.Action], **where: Any) -> Result:
    """The Result of a finished launch; ``where`` names its workspace, record and changes."""
    outcome, used = limited.outcome, limited.usage
    return Result(
        notes=tuple(a.line() for a in actions), audit=tuple(a.to_json() for a in actions),
        exit_code=outcome.exit_code, status=outcome.status, signal=outcome.signal,
        wall_s=outcome.wall_s, cpu_s=None if used is None else used.cpu_s,
        peak_memory_bytes=None if used is None else used.peak_memory_bytes,
        stdout=outcome.stdout, stderr=outcome.stderr, truncated=outcome.truncated,
        denials=denials, unenforced_limits=cg_plan.unenforced, error=outcome.error, **where)


def _execute(sb: Sandbox, policy: Policy, facts: host.HostFacts, cg_plan: Plan, run_id: str,
             measured: str, record_dir: str | None, capture: bool, stdin: bytes | None,
             image: Image | None = None, disk_why: str = "", early: Any = None
             ) -> tuple[Limited, tuple[dict[str, Any], ...], str | None]:
    """Launch ``sb`` with its egress session and its limits; both are closed on return.

    ``measured`` is the directory whose growth counts against the disk limit
    (``image``, when given, is its file system; see :func:`corral.enforce.launch_limited`).
    Returns the limited outcome, the egress denials and the egress log's path.
    ``early``: the run's egress.prefork() session, if any.
    """
    net = egress.open_session(policy.network, record_dir, cpu_share=policy.limits.cpus,
                              early=early) if policy.network.allow else egress.NoEgress()
    with net:
        # A proxy thread, and bwrap started by forking this process (a Python preexec_fn):
        # wait for the thread first, since a fork mid-import would leave its locks held.
        # Without a proxy there is no thread, and the init's files need not be checked.
        if net.pass_fds and sb.init_binary is None:
            net.quiesce()
        limited = enforce.launch_limited(
            net.attach(sb), policy, facts, cg_plan, run_id, measured, image, disk_why,
            capture=capture,
            stdin=stdin, output_cap=policy.limits.output_bytes,
            timeout_s=policy.limits.timeout_s, bwrap_path=facts.require_bwrap(),
            host_hint=guard.userns_hint(facts), extra_fds=net.pass_fds)
    if net.error is not None:  # the proxy failed while the run went on: relayed nothing
        o = limited.outcome
        o.status, o.exit_code = "error", CORRAL_FAILED
        o.error = net.error if o.error is None else f"{o.error}; {net.error}"
    return limited, net.denials(), net.log_path
