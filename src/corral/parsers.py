"""argparse parsers for every verb: their help, their errors, and every use of the
command line that :func:`corral.options.parse` leaves to them.

Only the verb being run gets its options built (argparse is slow to build); the list
of all verbs is for ``corral --help`` and for a verb that is not known.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import options
from .errors import UsageError

__all__ = ["USAGE", "VERBS", "parse"]

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


def _run_parser(p: argparse.ArgumentParser) -> None:
    p.usage = "corral run [options] -- CMD [ARG...]"
    p.description = ("Run CMD with /work (a fresh per-run directory) as the only writable "
                     "path, no network, a clean environment and limits.")
    options.add(p, options.table("run"))


def _agent_parser(a: argparse.ArgumentParser) -> None:
    a.usage = "corral agent [options] -- AGENT [ARG...]"
    a.description = ("Run AGENT with this directory writable, the rest of the system "
                     "read-only, the home directory hidden, and network only to the profile's "
                     "model API (and --allow-domain names) through corral's proxy.")
    options.add(a, options.table("agent"))


def _shell_parser(s: argparse.ArgumentParser) -> None:
    s.usage = "corral shell [options] ([-l] -c CMD | --prefix STRING | -- ARGV...)"
    s.description = ("Run CMD with /bin/bash -c (or /bin/sh), or ARGV as given, in this "
                     "project directory, with the same filesystem rules as corral agent and no "
                     "network unless --allow-domain: per-command isolation for agents that let "
                     "you set a shell or a command prefix.")
    options.add(s, options.table("shell"))
    s.add_argument("-c", dest="command", metavar="CMD", help="the command, run by the shell")
    s.add_argument("-l", dest="login", action="store_true",
                   help="a login shell, like bash -l (also -lc CMD)")
    s.add_argument("--prefix", action="store_true",
                   help="as Claude Code's CLAUDE_CODE_SHELL_PREFIX: run the one argument "
                   "that follows, Claude's whole command string (see docs/agents.md)")
    s.add_argument("words", nargs="*", help=argparse.SUPPRESS)


def _mcp_parser(m: argparse.ArgumentParser) -> None:
    options.add(m, options.table("mcp"))
    m.add_argument("--venv", metavar="DIR", help="a virtualenv, read-only, first on PATH")
    from .mcp.command import add_arguments

    add_arguments(m)


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


# verb -> (one-line help, what fills its parser)
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
    for name, (help_text, fill) in VERBS.items() if verb not in VERBS else [(verb, VERBS[verb])]:
        p = sub.add_parser(name, help=help_text)
        if name == verb:
            fill(p)
    return parser


def parse(words: Sequence[str]) -> options.Args:
    """``words`` (the options before ``--``) parsed by argparse: raises UsageError, or
    exits after printing the help or the version."""
    verb = next((w for w in words if not w.startswith("-")), None)
    return options.Args(**vars(_parser(verb).parse_args(words)))
