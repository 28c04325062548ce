"""Test-only: run corral's exact sandbox with chosen kernel layers removed.

Negative controls need "the same attempt with that layer turned off", and
the public relaxations only permit running where a layer is missing.  This
script resolves a run the way :func:`corral.api.run` does, removes the named
layers from the resolved :class:`~corral.bwrap.Sandbox`, launches it and
prints one JSON object.  It runs as whichever identity the test chose, so it
is a script rather than a fixture.

    layers.py [--off seccomp|landlock|payload-filter]... [--profile NAME]
              [--input PATH]... [--ro PATH]... [--extra-writable DIR]
              [--allow-domain NAME] [--disk SIZE] [--init-pid N] -- CMD [ARG...]

``--extra-writable DIR`` binds DIR writable at /extra without giving
Landlock a rule for it: the mounts alone would allow writes there.
``--allow-domain`` starts the egress proxy and the in-sandbox bridge, as
``corral run --allow-domain`` does.  ``--disk SIZE`` launches with the run's
limits as :func:`corral.api.run` does (started by root: the workspace's own
file system image, copied out afterwards; else the watcher), and adds the
record's ``limits`` to the output.  ``--init-pid N`` tells the init to expect
PID N, where the seccomp filter protects PID 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from corral import api, egress, enforce, errors, host, launch, resolve
from corral.bwrap import Mount, Sandbox, mount
from corral.policy import Network, Policy, parse_size
from corral.profiles import load_profile
from corral.record import replace


def without(sb: Sandbox, off: list[str], extra: str | None, init_pid: int | None = None
            ) -> Sandbox:
    config = dict(sb.init_config)
    if init_pid is not None:
        config["pid"] = init_pid
    if "landlock" in off:
        config["landlock"] = None
    if "payload-filter" in off:
        config.pop("payload_seccomp", None)
    sb = replace(sb, init_config=config)
    if "seccomp" in off:
        sb = replace(sb, seccomp=None)
    if extra is not None:
        bind = mount(Mount(extra, "/extra", writable=True, by_fd=True), set())
        sb = replace(sb, mounts=(*sb.mounts, *bind))
    return sb


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--off", action="append", default=[],
                   choices=["seccomp", "landlock", "payload-filter"])
    p.add_argument("--profile", default="shell")
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--ro", action="append", default=[])
    p.add_argument("--extra-writable")
    p.add_argument("--allow-domain", action="append", default=[])
    p.add_argument("--disk")
    p.add_argument("--init-pid", type=int)
    p.add_argument("cmd", nargs="+")
    args = p.parse_args()
    policy = load_profile(args.profile)
    if args.disk:
        policy = replace(policy, limits=replace(policy.limits,
                                                disk_bytes=parse_size(args.disk)))
    network = Network(allow=tuple(args.allow_domain)) if args.allow_domain else policy.network
    policy = replace(policy, read_only=(*policy.read_only, *args.ro), network=network)
    facts = host.detect()
    run_dir, (uid, gid) = api.prepare(policy, workspace_dir=None, inputs=args.input,
                                      runs_dir=None, facts=facts)
    sb = resolve.resolve_run(policy, args.cmd, facts, run_dir.workspace, uid, gid)
    sb = without(sb, args.off, args.extra_writable, args.init_pid)
    net = egress.open_session(policy.network, None)  # NoEgress without an allowed name
    launch_args = {"capture": True, "stdin": None, "output_cap": 1 << 20, "timeout_s": 120,
                   "bwrap_path": facts.require_bwrap(), "extra_fds": net.pass_fds}
    limits: dict[str, object] = {}
    with net:
        try:
            if args.disk:
                out, limits = _limited(net.attach(sb), policy, facts, run_dir, (uid, gid),
                                       launch_args)
            else:
                out = launch.launch(net.attach(sb), **launch_args)
        except errors.LaunchError as e:  # the init refused to start the command
            print(json.dumps({"status": "refused", "error": str(e)}))
            return
    print(json.dumps({"exit_code": out.exit_code, "status": out.status, "error": out.error,
                      "stdout": (out.stdout or b"").decode(errors="replace"),
                      "stderr": (out.stderr or b"").decode(errors="replace"),
                      "workspace": run_dir.workspace, "limits": limits}))


def _limited(sb: Sandbox, policy: Policy, facts: host.HostFacts, run_dir: Any,
             owner: tuple[int, int], launch_args: dict[str, Any]
             ) -> tuple[launch.Outcome, dict[str, object]]:
    why = enforce.image_unavailable(policy, facts, fresh=True)
    image = None
    if why is None:
        assert policy.limits.disk_bytes is not None
        image, why = enforce.make_image(run_dir.root, policy.limits.disk_bytes, owner)
    exported: dict[str, object] = {}
    try:
        limited = enforce.launch_limited(sb, policy, facts, enforce.check(policy, facts),
                                         run_dir.run_id, run_dir.workspace, image, why or "",
                                         **launch_args)
    finally:
        if image is not None:
            exported = enforce.release_image(image, run_dir.workspace)
    return limited.outcome, {**limited.record, **exported}


if __name__ == "__main__":
    main()
