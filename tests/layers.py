"""Test-only: run corral's exact sandbox with chosen kernel layers removed.

Negative controls need "the same attempt with that layer turned off", and
the public relaxations only permit running where a layer is missing.  This
script resolves a run the way :func:`corral.api.run` does, removes the named
layers from the resolved :class:`~corral.bwrap.Sandbox`, launches it and
prints one JSON object.  It runs as whichever identity the test chose, so it
is a script rather than a fixture.

    layers.py [--off seccomp|landlock|payload-filter]... [--profile NAME]
              [--input PATH]... [--extra-writable DIR] -- CMD [ARG...]

``--extra-writable DIR`` binds DIR writable at /extra without giving
Landlock a rule for it: the mounts alone would allow writes there.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from corral import api, host, launch, resolve
from corral.bwrap import Mount, Sandbox, mount
from corral.profiles import load_profile


def without(sb: Sandbox, off: list[str], extra: str | None) -> Sandbox:
    config = dict(sb.init_config)
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
    p.add_argument("--extra-writable")
    p.add_argument("cmd", nargs="+")
    args = p.parse_args()
    policy = load_profile(args.profile)
    facts = host.detect()
    run_dir, (uid, gid) = api.prepare(policy, workspace_dir=None, inputs=args.input,
                                      runs_dir=None, facts=facts)
    sb = resolve.resolve_run(policy, args.cmd, facts, run_dir.workspace, uid, gid)
    sb = without(sb, args.off, args.extra_writable)
    out = launch.launch(sb, capture=True, stdin=None, output_cap=1 << 20, timeout_s=120,
                        bwrap_path=facts.require_bwrap())
    print(json.dumps({"exit_code": out.exit_code, "status": out.status,
                      "stdout": (out.stdout or b"").decode(errors="replace"),
                      "stderr": (out.stderr or b"").decode(errors="replace"),
                      "workspace": run_dir.workspace}))


if __name__ == "__main__":
    main()
