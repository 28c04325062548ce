"""``corral agent`` and ``corral shell`` on the command line: a thin layer over
:func:`corral.api.run_agent` (see :mod:`corral.cli` for exit statuses and errors)."""

from __future__ import annotations

import os
import sys

from .cli import _ending, _env, _policy, network_line
from .errors import UsageError
from .options import Args
from .record import replace

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["cmd_agent"]


def cmd_agent(args: Args, cmd: list[str]) -> int:
    from . import api
    from .agent import note_environment, profile_for
    from .host import detect
    from .launch import dry_run_lines

    writable_files: tuple[str, ...] = ()
    if args.verb == "shell":
        cmd, policy, writable_files = _shell_command(args, cmd)
    else:
        if not cmd:
            raise UsageError("no agent given", "corral agent runs the command after --",
                             "write it like: corral agent -- claude")
        policy = _policy(args, profile_for(cmd))
    env = _env(args.env)
    project = os.getcwd()
    if args.dry_run:
        sb, layout = api.plan_agent(cmd, policy, project=project, env=env)
        for e in layout.entries():
            bound = f" <- {e.source}" if e.source and e.source not in e.reason else ""
            print(f"{e.access:<7} {e.kind:<4} {e.path}{bound}  ({e.reason})")
        print()
        print("\n".join(dry_run_lines(sb, detect().require_bwrap())))
        return 0

    def announce(sb: Any, layout: Any) -> None:
        if args.verb != "agent":
            return
        for note in layout.notes:
            print(f"corral: {note}", file=sys.stderr)
        print(note_environment(sb), file=sys.stderr)
        print(network_line(policy.network), file=sys.stderr)

    if writable_files:
        from .agent.shell import prepare

        prepare(writable_files, _owner_if_root(policy, project))
    result = api.run_agent(cmd, policy, project=project, env=env, runs_dir=args.runs_dir,
                           record=args.verb == "agent", announce=announce,
                           import_state=getattr(args, "import_state", False))
    for note in result.notes:
        print(f"corral: warning: {note}", file=sys.stderr)
    if result.unenforced_limits:
        print(f"corral: note: not enforced on this host (--allow unenforced-limits): "
              f"{', '.join(result.unenforced_limits)}", file=sys.stderr)
    if (ending := _ending(result, policy)) is not None:
        print(ending, file=sys.stderr)
    return result.exit_code


def _shell_command(args: Args, cmd: list[str]
                   ) -> tuple[list[str], Any, tuple[str, ...]]:
    """corral shell's argv and policy; the files to create before it runs (--prefix)."""
    from .agent import shell

    given = [args.command is not None, bool(cmd), args.prefix]
    if sum(given) != 1 or (args.words and not args.prefix):
        raise UsageError("corral shell needs exactly one command",
                         "give it with -c CMD (or -lc CMD), --prefix STRING, or as ARGV "
                         "after --", "write it like: corral shell -c 'make test'")
    policy = _policy(args, "generic")
    if args.prefix:
        found = shell.from_prefix(args.words)
        policy = replace(policy, read_only=policy.read_only + found.read_only,
                         writable=policy.writable + found.writable_files)
        return found.argv, policy, found.writable_files
    if args.command is not None:
        return shell.shell_argv(args.command, args.login), policy, ()
    return cmd, policy, ()


def _owner_if_root(policy: Any, project: str) -> tuple[int, int] | None:
    """Started by root: who the command will run as (the project's owner, or --user)."""
    from .agent import identity
    from .host import detect

    facts = detect()
    if not facts.is_root:
        return None
    uid, gid, _, _ = identity(os.path.realpath(project), facts, policy)
    return uid, gid
