"""The sandboxing verbs' options as data, and a direct parse of their plain use.

argparse costs ~22 M instructions at every start: its import (gettext and locale with
it), building the verb's parser, and the parse; about a ninth of
``corral run -- /bin/true``.  :func:`parse` reads ``corral run`` and ``corral agent``
straight from the tables below, but only where argparse is sure to read the words the
same way: the verb first, then long options of that verb's table spelled in full, each
value in the next word or after ``=``.  Anything else (an abbreviation, a value that
begins with ``-``, ``--help``, an option of another verb, a stray word) gives None, and
:mod:`corral.parsers` parses the words with argparse, its help and its errors.  The same
tables fill those argparse parsers (:func:`add`), and tests/test_options.py holds the
two parses to the same result.
"""

from __future__ import annotations

from types import SimpleNamespace

from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["AGENT", "COMMON", "NETWORK", "RUN", "Args", "Opt", "add", "parse", "table"]

Args = SimpleNamespace  # what every verb's command gets, from either parse


class Opt(NamedTuple):
    """One long option: ``value`` (the last one given wins), ``append`` (each one is
    kept, in order) or ``flag`` (present or not)."""

    flag: str
    kind: str
    metavar: str | None = None
    help: str | Callable[[], str] = ""

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def default(self) -> object:
        return [] if self.kind == "append" else False if self.kind == "flag" else None


def _relaxations() -> str:
    from .policy import Allow

    return "weaken one protection on purpose: " + ", ".join(Allow.names())


NETWORK = (
    Opt("--allow-domain", "append", "NAME[:PORT]",
        "let the command reach NAME (or *.NAME: its subdomains) through corral's proxy, on "
        "PORT or any port (repeatable)"),
    Opt("--deny-domain", "append", "NAME[:PORT]",
        "never let it reach NAME; wins over --allow-domain (repeatable)"),
    Opt("--resolve", "append", "NAME:ADDRESS",
        "resolve NAME to ADDRESS for this run, which it may then reach even if it is "
        "loopback or private (repeatable)"),
)
# run, agent, shell and mcp: after each verb's own --profile
COMMON = (
    Opt("--timeout", "value", "SECONDS", "wall-clock limit (e.g. 30, 5m)"),
    Opt("--memory", "value", "SIZE", "memory of the whole run, tmpfs included (e.g. 512M, 2G)"),
    Opt("--pids", "value", "N", "processes and threads of the whole run"),
    Opt("--cpus", "value", "N", "CPU bandwidth in cores (e.g. 0.5, 2)"),
    Opt("--disk", "value", "SIZE", "bytes the run may add to its workspace"),
    Opt("--env", "append", "NAME[=VALUE]",
        "set a variable inside; NAME alone copies it from here (repeatable)"),
    Opt("--ro", "append", "PATH",
        "make a host path visible read-only at the same path (repeatable)"),
    Opt("--user", "value", "USER", "started by root: run as USER (NAME, UID[:GID])"),
    Opt("--runs-dir", "value", "DIR", "where per-run directories go"),
    Opt("--allow", "append", "RELAXATION", _relaxations),
    Opt("--dry-run", "flag", None, "print the sandbox and stop"),
    *NETWORK,
)
# agent and shell
AGENT = (
    Opt("--rw", "append", "PATH",
        "also make PATH writable, e.g. an agent's state folder (repeatable)"),
    Opt("--hide", "append", "PATH", "also make PATH appear empty (repeatable)"),
    Opt("--protect", "append", "NAME",
        "also keep files named NAME read-only in writable trees (repeatable)"),
    Opt("--allow-secret", "append", "GLOB",
        "leave secret-looking files matching GLOB visible (repeatable)"),
    Opt("--home", "value", "DIR", "treat DIR as the agent's home directory (default: $HOME, "
        "or the project owner's when started by root)"),
)
RUN = (
    Opt("--workspace", "value", "DIR", "use DIR as /work instead of a fresh one"),
    Opt("--input", "append", "PATH", "copy PATH into /work first (repeatable)"),
    Opt("--venv", "value", "DIR", "a virtualenv, read-only, first on PATH"),
    Opt("--json", "flag", None, "capture output; print one JSON result"),
)
IMPORT_STATE = Opt("--import-state", "flag", None,
                   "copy the agent's settings from your real state folder into corral's "
                   "private copy again (done by itself on first use)")
PROFILES = {  # --profile's help, by verb
    "run": "python, node, shell, or a TOML file (default: from CMD's name)",
    "agent": "claude, codex, pi, aider, gemini, generic, or a TOML file (default: from "
             "AGENT's name)",
    "shell": "generic (default), an agent's profile, or a TOML file",
    "mcp": "python (default), node, shell, or a TOML file",
}


def table(verb: str) -> tuple[Opt, ...]:
    """Every long option of ``verb`` that the tables hold, in the order of its --help."""
    profile = Opt("--profile", "value", "NAME|FILE", PROFILES[verb])
    own = {"run": RUN, "agent": (*AGENT, IMPORT_STATE), "shell": AGENT, "mcp": ()}[verb]
    return (profile, *COMMON, *own)


def add(parser: object, opts: Sequence[Opt]) -> None:
    """Add ``opts`` to an argparse parser (see :mod:`corral.parsers`)."""
    for o in opts:
        text = o.help() if callable(o.help) else o.help
        if o.kind == "flag":
            parser.add_argument(o.flag, action="store_true", help=text)  # type: ignore[attr-defined]
        else:
            parser.add_argument(  # type: ignore[attr-defined]
                o.flag, metavar=o.metavar, help=text,
                **({"action": "append", "default": []} if o.kind == "append" else {}))


DIRECT = ("run", "agent")  # the verbs parse() reads; shell's short options are argparse's


def parse(words: Sequence[str]) -> Args | None:
    """``words`` (the options before ``--``) as argparse would read them, or None when
    they are not the plain use this reads (then argparse must: corral.parsers)."""
    if not words or words[0] not in DIRECT:
        return None
    verb = words[0]
    known = {o.flag: o for o in table(verb)}
    values: dict[str, object] = {o.dest: o.default() for o in known.values()}
    rest = iter(words[1:])
    for word in rest:
        name, eq, value = word.partition("=")
        opt = known.get(name)
        if opt is None or not name.startswith("--"):
            return None
        if opt.kind == "flag":
            if eq:
                return None
            values[opt.dest] = True
            continue
        if not eq:
            following = next(rest, None)
            if following is None or following.startswith("-"):
                return None
            value = following
        if value == "--":  # argparse drops a value that is exactly "--"
            return None
        if opt.kind == "append":
            appended = values[opt.dest]
            assert isinstance(appended, list)
            appended.append(value)
        else:
            values[opt.dest] = value
    return Args(verb=verb, **values)
