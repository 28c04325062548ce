"""The ``corral`` command: a thin layer over :mod:`corral.api`.

Exit status is decided here and only here: the command's own status; 124 on
timeout; 125 when the sandbox could not be set up (any
:class:`~corral.errors.CorralError`, bad flags included), with one line on
stderr: ``corral: error: WHAT; WHY; HOW TO FIX``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from .errors import CorralError, UsageError

SETUP_FAILED = 125
USAGE = """corral run [options] -- CMD [ARG...]
       corral doctor [--json]
       corral delegate --user NAME [--undo]"""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, "", f"see '{self.prog} --help'")


def _run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run one command in a fresh sandbox",
                       usage="corral run [options] -- CMD [ARG...]",
                       description="Run CMD with /work (a fresh per-run directory) as the only "
                       "writable path, no network, a clean environment and limits.")
    p.add_argument("--profile", metavar="NAME|FILE",
                   help="python, node, shell, or a TOML file (default: from CMD's name)")
    p.add_argument("--workspace", metavar="DIR", help="use DIR as /work instead of a fresh one")
    p.add_argument("--input", metavar="PATH", action="append", default=[],
                   help="copy PATH into /work first (repeatable)")
    p.add_argument("--timeout", metavar="SECONDS", help="wall-clock limit (e.g. 30, 5m)")
    p.add_argument("--memory", metavar="SIZE", help="memory of the whole run, tmpfs included "
                   "(e.g. 512M, 2G)")
    p.add_argument("--pids", metavar="N", help="processes and threads of the whole run")
    p.add_argument("--cpus", metavar="N", help="CPU bandwidth in cores (e.g. 0.5, 2)")
    p.add_argument("--disk", metavar="SIZE", help="bytes the run may add to its workspace")
    p.add_argument("--env", metavar="NAME[=VALUE]", action="append", default=[],
                   help="set a variable inside; NAME alone copies it from here (repeatable)")
    p.add_argument("--venv", metavar="DIR", help="a virtualenv, read-only, first on PATH")
    p.add_argument("--ro", metavar="PATH", action="append", default=[],
                   help="make a host path visible read-only at the same path (repeatable)")
    p.add_argument("--user", metavar="USER", help="started by root: run as USER (NAME, UID[:GID])")
    p.add_argument("--runs-dir", metavar="DIR", help="where per-run directories go")
    p.add_argument("--allow", metavar="RELAXATION", action="append", default=[],
                   help="weaken one protection on purpose: " + ", ".join(_relaxations()))
    p.add_argument("--json", action="store_true", help="capture output; print one JSON result")
    p.add_argument("--dry-run", action="store_true", help="print the bwrap invocation and stop")


def _relaxations() -> tuple[str, ...]:
    from .policy import Allow

    return Allow.names()


def _parser() -> Parser:
    parser = Parser(prog="corral", usage=USAGE,
                    description="Sandbox AI coding agents and the scripts they write.")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)
    _run_parser(sub)
    d = sub.add_parser("doctor", help="what this host supports and which protections hold")
    d.add_argument("--json", action="store_true")
    g = sub.add_parser("delegate", help="as root: let USER's runs have cgroup limits (v1 hosts)",
                       description="Create <cgroup v1 hierarchy>/corral/uid-UID for USER, owned "
                       "by them, so that their runs can have memory, pids and CPU limits.")
    g.add_argument("--user", required=True, metavar="NAME")
    g.add_argument("--undo", action="store_true", help="remove the delegation again")
    return parser


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it."""
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1:])
    return list(argv), []


def _profile_for(cmd: Sequence[str]) -> str:
    name = os.path.basename(cmd[0]) if cmd else ""
    if name.startswith(("python", "pip", "pypy")):
        return "python"
    if name in ("node", "nodejs", "npm", "npx"):
        return "node"
    return "shell"


def _env(items: Sequence[str]) -> list[tuple[str, str]]:
    from .policy import check_env_name

    env = []
    for item in items:
        name, eq, value = item.partition("=")
        check_env_name(name)
        if not eq:
            if name not in os.environ:
                raise UsageError(f"--env {name}: {name} is not set here",
                                 "NAME alone copies the variable from corral's environment",
                                 f"set it, or write --env {name}=VALUE")
            value = os.environ[name]
        env.append((name, value))
    return env


def _policy(args: argparse.Namespace, cmd: Sequence[str]) -> Any:
    from .policy import Allow
    from .profiles import load_profile

    policy = load_profile(args.profile or _profile_for(cmd))
    limits = replace(policy.limits, **_limit_flags(args))
    unknown = [a for a in args.allow if a not in Allow.names()]
    if unknown:
        raise UsageError(f"--allow {unknown[0]} is not a relaxation corral knows",
                         f"known: {', '.join(Allow.names())}", "fix the name")
    allow = replace(policy.allow, **{a.replace("-", "_"): True for a in args.allow})
    return replace(policy, limits=limits, allow=allow, venv=args.venv or policy.venv,
                   user=args.user, read_only=policy.read_only + tuple(
                       os.path.abspath(p) for p in args.ro))


def _count(text: str, flag: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise UsageError(f"{flag} {text!r} is not a positive {kind.__name__}", "",
                         f"write it like {flag} {'256' if kind is int else '1.5'}")
    return value


def _limit_flags(args: argparse.Namespace) -> dict[str, Any]:
    """Limits given on the command line, which override the profile's."""
    from .policy import parse_duration, parse_size

    out: dict[str, Any] = {}
    if args.timeout is not None:
        out["timeout_s"] = parse_duration(args.timeout, "--timeout")
    if args.memory is not None:
        out["memory_bytes"] = parse_size(args.memory, "--memory")
    if args.pids is not None:
        out["pids"] = int(_count(args.pids, "--pids", int))
    if args.cpus is not None:
        out["cpus"] = _count(args.cpus, "--cpus", float)
    if args.disk is not None:
        out["disk_bytes"] = parse_size(args.disk, "--disk")
    return out


ENDINGS = {  # what the CLI says on stderr when corral, not the command, ended the run
    "timeout": "corral: timed out ({limit}); killed the sandbox",
    "oom": "corral: out of memory: the memory limit ({limit}) killed the command",
    "disk-limit": "corral: stopped at the disk limit: the run added more than {limit} to its "
                  "workspace",
}


def _size(n: int | None) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n is not None and n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def _ending(result: Any, policy: Any) -> str | None:
    lim = policy.limits
    limit = {"timeout": f"limit {lim.timeout_s:g}s wall clock" + (
        f" or {lim.cpu_s:g}s CPU time" if lim.cpu_s else ""),
        "oom": _size(lim.memory_bytes), "disk-limit": _size(lim.disk_bytes)}
    if result.status not in ENDINGS:
        return None
    return ENDINGS[result.status].format(limit=limit[result.status])


def cmd_run(args: argparse.Namespace, cmd: list[str]) -> int:
    from . import api
    from .host import detect
    from .launch import dry_run_lines

    if not cmd:
        raise UsageError("no command given", "corral runs the command after --",
                         "write it like: corral run -- python3 script.py")
    policy = _policy(args, cmd)
    env = _env(args.env)
    if args.dry_run:
        sb = api.plan(cmd, policy, workspace_dir=args.workspace, inputs=args.input, env=env,
                      runs_dir=args.runs_dir)
        from .enforce import check
        from .limits import describe

        print("\n".join(dry_run_lines(sb, detect().require_bwrap())
                        + describe(check(policy, detect()))))
        return 0
    result = api.run(cmd, policy, workspace_dir=args.workspace, inputs=args.input,
                     capture=args.json, env=env, runs_dir=args.runs_dir)
    if result.unenforced_limits:
        print(f"corral: note: not enforced on this host (--allow unenforced-limits): "
              f"{', '.join(result.unenforced_limits)}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json()))
    elif (ending := _ending(result, policy)) is not None:
        print(ending, file=sys.stderr)
    return result.exit_code


def cmd_delegate(args: argparse.Namespace) -> int:
    from .cgroups import delegate
    from .host import detect

    for path in delegate(args.user, detect(), undo=args.undo):
        print(("removed " if args.undo else "delegated ") + path)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import render_text, report

    data = report()
    print(json.dumps(data, indent=2) if args.json else render_text(data))
    return 0 if data["ready"] else 1


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    options, cmd = _split(argv)
    json_mode = "--json" in options
    try:
        args = _parser().parse_args(options)
        if args.verb == "run":
            code = cmd_run(args, cmd)
        else:
            if cmd:
                raise UsageError(f"corral {args.verb} takes no command", "", "drop the --")
            code = cmd_doctor(args) if args.verb == "doctor" else cmd_delegate(args)
    except CorralError as e:
        print(f"corral: error: {e}", file=sys.stderr)
        if json_mode:
            print(json.dumps({"status": "error", "exit_code": SETUP_FAILED, "error": str(e)}))
        code = SETUP_FAILED
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.exit(code)
