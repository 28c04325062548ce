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
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .errors import STOPPING, CorralError, Interrupted, UsageError
from .record import replace

SETUP_FAILED = 125
USAGE = """corral run [options] -- CMD [ARG...]
       corral agent [options] -- AGENT [ARG...]
       corral shell [options] ([-l] -c CMD | --prefix STRING | -- ARGV...)
       corral mcp [options] [--transport stdio|http] [--host H --port N]
       corral probe [--profile NAME] [--launcher 'PREFIX ...'] [--json]
       corral batch JOBS.jsonl -o RESULTS.jsonl [--workers N] [--engine local|ray] [--resume]
       corral serve [--host ADDR] [--port N] [--workers N] [--token-file FILE]
       corral doctor [--json]
       corral delegate --user NAME [--undo]"""


def _columns() -> int:
    """What shutil.get_terminal_size gives argparse, without importing shutil (and bz2 and
    lzma with it: ~2.5 ms of every start, bench/floor.py)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)  # argparse's own margin


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, "", f"see '{self.prog} --help'")


def _common(p: argparse.ArgumentParser, profiles: str) -> None:
    p.add_argument("--profile", metavar="NAME|FILE", help=profiles)
    p.add_argument("--timeout", metavar="SECONDS", help="wall-clock limit (e.g. 30, 5m)")
    p.add_argument("--memory", metavar="SIZE", help="memory of the whole run, tmpfs included "
                   "(e.g. 512M, 2G)")
    p.add_argument("--pids", metavar="N", help="processes and threads of the whole run")
    p.add_argument("--cpus", metavar="N", help="CPU bandwidth in cores (e.g. 0.5, 2)")
    p.add_argument("--disk", metavar="SIZE", help="bytes the run may add to its workspace")
    p.add_argument("--env", metavar="NAME[=VALUE]", action="append", default=[],
                   help="set a variable inside; NAME alone copies it from here (repeatable)")
    p.add_argument("--ro", metavar="PATH", action="append", default=[],
                   help="make a host path visible read-only at the same path (repeatable)")
    p.add_argument("--user", metavar="USER", help="started by root: run as USER (NAME, UID[:GID])")
    p.add_argument("--runs-dir", metavar="DIR", help="where per-run directories go")
    p.add_argument("--allow", metavar="RELAXATION", action="append", default=[],
                   help="weaken one protection on purpose: " + ", ".join(_relaxations()))
    p.add_argument("--dry-run", action="store_true", help="print the sandbox and stop")
    add_network_flags(p)


def _agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rw", metavar="PATH", action="append", default=[],
                   help="also make PATH writable, e.g. an agent's state folder (repeatable)")
    p.add_argument("--hide", metavar="PATH", action="append", default=[],
                   help="also make PATH appear empty (repeatable)")
    p.add_argument("--protect", metavar="NAME", action="append", default=[],
                   help="also keep files named NAME read-only in writable trees (repeatable)")
    p.add_argument("--allow-secret", metavar="GLOB", action="append", default=[],
                   help="leave secret-looking files matching GLOB visible (repeatable)")
    p.add_argument("--home", metavar="DIR",
                   help="treat DIR as the agent's home directory (default: $HOME, or the "
                   "project owner's when started by root)")


def _run_parser(p: argparse.ArgumentParser) -> None:
    p.usage = "corral run [options] -- CMD [ARG...]"
    p.description = ("Run CMD with /work (a fresh per-run directory) as the only writable "
                     "path, no network, a clean environment and limits.")
    _common(p, "python, node, shell, or a TOML file (default: from CMD's name)")
    p.add_argument("--workspace", metavar="DIR", help="use DIR as /work instead of a fresh one")
    p.add_argument("--input", metavar="PATH", action="append", default=[],
                   help="copy PATH into /work first (repeatable)")
    p.add_argument("--venv", metavar="DIR", help="a virtualenv, read-only, first on PATH")
    p.add_argument("--json", action="store_true", help="capture output; print one JSON result")


def add_network_flags(p: Any) -> None:
    """--allow-domain, --deny-domain, --resolve: shared by run, agent and shell."""
    p.add_argument("--allow-domain", metavar="NAME[:PORT]", action="append", default=[],
                   help="let the command reach NAME (or *.NAME: its subdomains) through "
                   "corral's proxy, on PORT or any port (repeatable)")
    p.add_argument("--deny-domain", metavar="NAME[:PORT]", action="append", default=[],
                   help="never let it reach NAME; wins over --allow-domain (repeatable)")
    p.add_argument("--resolve", metavar="NAME:ADDRESS", action="append", default=[],
                   help="resolve NAME to ADDRESS for this run, which it may then reach "
                   "even if it is loopback or private (repeatable)")


def network_from_args(network: Any, args: argparse.Namespace) -> Any:
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


def _agent_parser(a: argparse.ArgumentParser) -> None:
    a.usage = "corral agent [options] -- AGENT [ARG...]"
    a.description = ("Run AGENT with this directory writable, the rest of the system "
                     "read-only, the home directory hidden, and network only to the profile's "
                     "model API (and --allow-domain names) through corral's proxy.")
    _common(a, "claude, codex, pi, aider, gemini, generic, or a TOML file "
               "(default: from AGENT's name)")
    _agent_options(a)
    a.add_argument("--import-state", action="store_true",
                   help="copy the agent's settings from your real state folder into corral's "
                   "private copy again (done by itself on first use)")


def _shell_parser(s: argparse.ArgumentParser) -> None:
    s.usage = "corral shell [options] ([-l] -c CMD | --prefix STRING | -- ARGV...)"
    s.description = ("Run CMD with /bin/bash -c (or /bin/sh), or ARGV as given, in this "
                     "project directory, with the same filesystem rules as corral agent and no "
                     "network unless --allow-domain: per-command isolation for agents that let "
                     "you set a shell or a command prefix.")
    _common(s, "generic (default), an agent's profile, or a TOML file")
    _agent_options(s)
    s.add_argument("-c", dest="command", metavar="CMD", help="the command, run by the shell")
    s.add_argument("-l", dest="login", action="store_true",
                   help="a login shell, like bash -l (also -lc CMD)")
    s.add_argument("--prefix", action="store_true",
                   help="as Claude Code's CLAUDE_CODE_SHELL_PREFIX: run the one argument "
                   "that follows, Claude's whole command string (see docs/agents.md)")
    s.add_argument("words", nargs="*", help=argparse.SUPPRESS)


def _mcp_parser(m: argparse.ArgumentParser) -> None:
    _common(m, "python (default), node, shell, or a TOML file")
    m.add_argument("--venv", metavar="DIR", help="a virtualenv, read-only, first on PATH")
    from .mcp.command import add_arguments

    add_arguments(m)


def _relaxations() -> tuple[str, ...]:
    from .policy import Allow

    return Allow.names()


def _probe_parser(p: argparse.ArgumentParser) -> None:
    p.usage = "corral probe [--profile NAME] [--launcher 'PREFIX ...'] [--json]"
    p.description = ("Plant canaries (a fake home with fake credentials, loopback servers, a "
                     "keyring key...), run a battery of escape attempts inside the sandbox, "
                     "check the host afterwards.  Exit 0 only if every check passed.  See "
                     "docs/probe.md.")
    p.add_argument("--profile", metavar="NAME|FILE",
                   help="the corral profile to audit (default: generic)")
    p.add_argument("--launcher", metavar="'PREFIX ...'",
                   help="audit another sandbox: a command prefix ($PWD and $HOME are "
                   "replaced), 'naive' (the seed's bwrap line) or 'none' (no sandbox)")
    p.add_argument("--check", metavar="ID|CATEGORY", action="append", default=[],
                   help="only these checks (repeatable)")
    p.add_argument("--allow", metavar="RELAXATION", action="append", default=[],
                   help="run corral with this relaxation (e.g. unenforced-limits where this "
                   "user has no cgroups): the checks it weakens will say so by failing")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _batch_parser(b: argparse.ArgumentParser) -> None:
    from .batch import add_arguments

    add_arguments(b)


def _serve_parser(s: argparse.ArgumentParser) -> None:
    from .serve import add_arguments

    add_arguments(s)


def _doctor_parser(d: argparse.ArgumentParser) -> None:
    d.add_argument("--json", action="store_true")


def _delegate_parser(g: argparse.ArgumentParser) -> None:
    g.description = ("Create <cgroup v1 hierarchy>/corral/uid-UID for USER, owned by them, so "
                     "that their runs can have memory, pids and CPU limits.")
    g.add_argument("--user", required=True, metavar="NAME")
    g.add_argument("--undo", action="store_true", help="remove the delegation again")


# verb -> (one-line help, what fills its parser).  Only the verb being run gets its options:
# argparse is slow to build, and this runs at every start.
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "run": ("run one command in a fresh sandbox", _run_parser),
    "agent": ("run a coding agent in this project directory", _agent_parser),
    "shell": ("run one shell command under agent-mode rules", _shell_parser),
    "mcp": ("serve the sandbox as MCP tools, a workspace per session", _mcp_parser),
    "probe": ("prove the sandbox on this machine: escape attempts", _probe_parser),
    "batch": ("run a JSON-lines file of requests, results as they finish", _batch_parser),
    "serve": ("serve requests over HTTP, SandboxFusion-compatible", _serve_parser),
    "doctor": ("what this host supports and which protections hold", _doctor_parser),
    "delegate": ("as root: let USER's runs have cgroup limits (v1 hosts)", _delegate_parser),
}


def _parser(verb: str | None) -> Parser:
    parser = Parser(prog="corral", usage=USAGE,
                    description="Sandbox AI coding agents and the scripts they write.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    # prog given: argparse would otherwise format the top usage to name the verbs' parsers
    # by (all of USAGE: "see 'corral run [options]...\n  corral delegate ... run --help'")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser, prog="corral")
    # A known verb gets its own parser only; the list of all is for --help and a bad verb.
    for name, (help_text, fill) in VERBS.items() if verb not in VERBS else [(verb, VERBS[verb])]:
        p = sub.add_parser(name, help=help_text)
        if name == verb:
            fill(p)
    return parser


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


def _policy(args: argparse.Namespace, default_profile: str) -> Any:
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


def cmd_run(args: argparse.Namespace, cmd: list[str]) -> int:
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
        print(json.dumps(result.to_json()))
    ending = _ending(result, policy)
    if ending is not None and (not args.json or result.status == "error"):
        print(ending, file=sys.stderr)  # an error is said on stderr in --json mode too
    return result.exit_code


def cmd_mcp(args: argparse.Namespace) -> int:
    from .mcp.command import serve

    return serve(args, _policy, _env)


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import launcher_for, probe, render_text

    report = probe(launcher_for(args.launcher, args.profile, args.allow), args.check)
    import shutil

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(json.dumps(report.to_json(), indent=2) if args.json else render_text(report, width))
    return 0 if report.passed else 1


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
        verb = next((a for a in options if not a.startswith("-")), None)
        args = _parser(verb).parse_args(options)
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
            print(json.dumps({"status": "error", "exit_code": SETUP_FAILED, "error": str(e),
                              "notes": list(e.notes)}))
        code = SETUP_FAILED
    except Interrupted as e:
        _warn(e.notes)
        print(f"corral: interrupted (signal {e.signum}): the sandbox was stopped",
              file=sys.stderr)
        code = 128 + e.signum
        if json_mode:
            print(json.dumps({"status": "interrupted", "exit_code": code,
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
