"""The ``corral`` command: a thin layer over :mod:`corral.api`.

Exit status is decided here and only here: the command's own status; 124 on
timeout; 125 when the sandbox could not be set up (any
:class:`~corral.errors.CorralError`, bad flags included), with one line on
stderr: ``corral: error: WHAT; WHY; HOW TO FIX``.
"""

from __future__ import annotations

import os
import sys

from . import jsonio
from . import sig as signal
from .errors import STOPPING, CorralError, Interrupted, UsageError, standard_streams
from .options import Args
from .record import replace

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

SETUP_FAILED = 125


def network_from_args(network: Any, args: Args) -> Any:
    """The profile's network rules plus those given as flags."""
    from .policy import Network

    pins: tuple[tuple[str, str], ...] = ()
    if args.resolve:  # the rules' parser costs a few ms to import: only when needed
        from .egress.rules import parse_pin

        pins = tuple(parse_pin(p) for p in args.resolve)
    return Network(allow=(*network.allow, *args.allow_domain),
                   deny=(*network.deny, *args.deny_domain), resolve=(*network.resolve, *pins))


def network_line(network: Any) -> str:
    """What the run may reach, for one stderr line: allow rules that a deny rule cancels
    are not listed, and the deny rules that remain are named."""
    if not (network.allow or network.deny or network.resolve):
        return "corral: network: none"  # what the rules would say, without their ~3 ms import
    from .egress.rules import compile_rules

    rules = compile_rules(network)
    shown = rules.shown()
    if not shown:
        return "corral: network: none"
    never = [str(d) for d in rules.deny if not any(d.covers(a) for a in rules.allow)
             and any(a.covers(d) for a in rules.allow)]
    return (f"corral: network: only {', '.join(shown)}, through corral's proxy"
            + (f" (never {', '.join(never)})" if never else ""))


def parse(words: Sequence[str]) -> Args:
    """The options before ``--``: their plain use read directly (corral.options), the rest
    by argparse (corral.parsers), which also prints --help and says what is wrong."""
    from .options import parse as direct

    args = direct(words)
    if args is None:
        from .parsers import parse as with_argparse

        args = with_argparse(words)
    return args


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it."""
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1:])
    return list(argv), []


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


def _policy(args: Args, default_profile: str) -> Any:
    """The profile, with every flag applied on top."""
    from .profiles import load_profile

    policy = load_profile(args.profile or default_profile)
    limits = replace(policy.limits, **_limit_flags(args))
    allow = policy.allow.adding(args.allow)
    changes: dict[str, Any] = {
        "limits": limits, "allow": allow, "user": args.user,
        "network": network_from_args(policy.network, args),
        "read_only": policy.read_only + tuple(os.path.abspath(p) for p in args.ro),
    }
    if hasattr(args, "venv"):
        changes["venv"] = args.venv or policy.venv
    if hasattr(args, "rw"):
        changes.update(
            writable=policy.writable + tuple(os.path.abspath(p) for p in args.rw),
            hidden=policy.hidden + tuple(os.path.abspath(p) for p in args.hide),
            protect=policy.protect + tuple(args.protect),
            allow_secrets=policy.allow_secrets + tuple(args.allow_secret),
            home=os.path.abspath(args.home) if args.home else policy.home)
    return replace(policy, **changes)


def _count(text: str, flag: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise UsageError(f"{flag} {text!r} is not a positive {kind.__name__}", "",
                         f"write it like {flag} {'256' if kind is int else '1.5'}")
    return value


def _limit_flags(args: Args) -> dict[str, Any]:
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


# What the CLI says on stderr when a run went over a limit: corral ended it, or found it
# over once it had ended (a burst after the last look), so the words claim no kill.
ENDINGS = {
    "timeout": "corral: timed out: over the {limit}",
    "oom": "corral: out of memory: the memory limit ({limit}) killed the command",
    "disk-limit": "corral: over the disk limit: the run added more than {limit} to its "
                  "workspace",
}


def _size(n: int | None) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n is not None and n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def _ending(result: Any, policy: Any) -> str | None:
    lim = policy.limits
    if result.status == "error":  # corral lost sight of the run after it started
        return f"corral: error: {result.error}"
    if result.status not in ENDINGS:
        return None
    if result.status == "timeout":
        limits = [f"{lim.timeout_s:g}s wall clock"] if lim.timeout_s else []
        limits += [f"{lim.cpu_s:g}s CPU time"] if lim.cpu_s else []
        limit = "limit " + " or ".join(limits)
    else:
        limit = _size(lim.memory_bytes if result.status == "oom" else lim.disk_bytes)
    return ENDINGS[result.status].format(limit=limit)


def cmd_run(args: Args, cmd: list[str]) -> int:
    from . import api
    from .host import detect
    from .launch import dry_run_lines
    from .profiles import profile_for_command

    if not cmd:
        raise UsageError("no command given", "corral runs the command after --",
                         "write it like: corral run -- python3 script.py")
    policy = _policy(args, profile_for_command(cmd))
    env = _env(args.env)
    if args.dry_run:
        sb = api.plan(cmd, policy, workspace_dir=args.workspace, inputs=args.input, env=env,
                      runs_dir=args.runs_dir)
        from .enforce import check, image_unavailable
        from .limits import describe

        why = image_unavailable(policy, detect(), fresh=args.workspace is None)
        disk = [] if policy.limits.disk_bytes is None else [
            "# disk: the workspace is an ext4 image of its own, mounted by bwrap's child"
            if why is None else f"# disk: measured ({why})"]
        print("\n".join(dry_run_lines(sb, detect().require_bwrap())
                        + describe(check(policy, detect())) + disk))
        return 0
    result = api.run(cmd, policy, workspace_dir=args.workspace, inputs=args.input,
                     capture=args.json, env=env, runs_dir=args.runs_dir)
    _warn(result.notes)
    if result.unenforced_limits:
        print(f"corral: note: not enforced on this host (--allow unenforced-limits): "
              f"{', '.join(result.unenforced_limits)}", file=sys.stderr)
    if args.json:
        print(jsonio.dumps(result.to_json()))
    ending = _ending(result, policy)
    if ending is not None and (not args.json or result.status == "error"):
        print(ending, file=sys.stderr)  # an error is said on stderr in --json mode too
    return result.exit_code


def cmd_mcp(args: Args) -> int:
    from .mcp.command import serve

    return serve(args, _policy, _env)


def cmd_probe(args: Args) -> int:
    from .probe import launcher_for, probe, render_text

    report = probe(launcher_for(args.launcher, args.profile, args.allow), args.check)
    import shutil

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    import json

    print(json.dumps(report.to_json(), indent=2) if args.json else render_text(report, width))
    return 0 if report.passed else 1


def cmd_delegate(args: Args) -> int:
    from .cgroups import delegate
    from .host import detect

    for path in delegate(args.user, detect(), undo=args.undo):
        print(("removed " if args.undo else "delegated ") + path)
    return 0


def cmd_doctor(args: Args) -> int:
    from .doctor import render_text, report

    data = report()
    import json

    print(json.dumps(data, indent=2) if args.json else render_text(data))
    return 0 if data["ready"] else 1


def _warn(notes: Sequence[str]) -> None:
    """What the audit did: one line each, on stderr."""
    for note in notes:
        print(f"corral: warning: {note}", file=sys.stderr)


# Signals whose default is to end the process: they unwind like Ctrl-C (errors.STOPPING).
_STOPPING = tuple(sig for sig in STOPPING if sig != signal.SIGINT)


def _stop(signum: int, frame: object) -> None:
    """The first stopping signal ends the run through the usual teardown (the sandbox
    killed, its workspace copied out of its image, audited, its record written); later
    ones are ignored so that they cannot cut that teardown short."""
    for sig in (signal.SIGINT, *_STOPPING):
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    standard_streams()
    # Started by a parent that ignored SIGCHLD (exec keeps it ignored): children would be
    # reaped unseen, their statuses lost (corral.errors.children_seen).
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    console = argv is None  # the console script, not a caller in its own process
    argv = list(sys.argv[1:] if argv is None else argv)
    options, cmd = _split(argv)
    sandboxed = False
    json_mode = "--json" in options
    # Signals whose default is to end the process unwind like Ctrl-C: the sandbox is
    # killed, the run audited and recorded, before corral exits 128+N (SIGKILL cannot be
    # caught: see threat-model.md).
    for sig in _STOPPING:
        signal.signal(sig, _stop)
    try:
        args = parse(options)
        if args.verb in ("run", "agent", "shell"):
            sandboxed = True
            signal.signal(signal.SIGINT, _stop)  # a second Ctrl-C waits for the teardown
            from . import egress

            egress.fork_proxies()  # this process is corral's own: the proxy may be forked
        if args.verb == "run":
            code = cmd_run(args, cmd)
        elif args.verb in ("agent", "shell"):
            from .cli_agent import cmd_agent

            code = cmd_agent(args, cmd)
        elif args.verb == "mcp" and not cmd:
            code = cmd_mcp(args)
        elif args.verb == "probe" and not cmd:
            code = cmd_probe(args)
        elif args.verb == "batch" and not cmd:
            from .batch import main as batch

            code = batch(args)
        elif args.verb == "serve" and not cmd:
            from .serve import main as serve

            code = serve(args)
        else:
            if cmd:
                raise UsageError(f"corral {args.verb} takes no command", "", "drop the --")
            code = cmd_doctor(args) if args.verb == "doctor" else cmd_delegate(args)
    except BrokenPipeError:
        code = _reader_gone()
    except CorralError as e:
        _warn(e.notes)
        print(f"corral: error: {e}", file=sys.stderr)
        if json_mode:
            print(jsonio.dumps({"status": "error", "exit_code": SETUP_FAILED, "error": str(e),
                              "notes": list(e.notes)}))
        code = SETUP_FAILED
    except Interrupted as e:
        _warn(e.notes)
        print(f"corral: interrupted (signal {e.signum}): the sandbox was stopped",
              file=sys.stderr)
        code = 128 + e.signum
        if json_mode:
            print(jsonio.dumps({"status": "interrupted", "exit_code": code,
                              "signal": e.signum, "notes": list(e.notes)}))
    except KeyboardInterrupt:
        code = 130
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone()
    if console and sandboxed:
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> NoReturn:
    """The end of a sandboxed run on the command line.  Everything of the run is done and
    written by now (the sandbox ended, audited, recorded; every thread joined): tearing
    the interpreter down would only free memory, ~5-10 ms of every start-up."""
    try:
        sys.stderr.flush()
    finally:
        os._exit(code)


def prefix_main() -> NoReturn:
    """``corral-prefix STRING``: ``corral shell --prefix STRING``, as one program name.

    Claude Code takes everything in ``CLAUDE_CODE_SHELL_PREFIX`` but its last word as the
    program's path, so a prefix of more than two words cannot be given there.
    """
    main(["shell", "--prefix", *sys.argv[1:]])


def _reader_gone() -> int:
    """stdout's reader left (``corral run --json | head``): exit like SIGPIPE would, quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13
