"""``corral shell``: one command under agent-mode rules, called the way agents call a shell.

* ``corral shell -c CMD``, ``-lc CMD``, ``-l -c CMD``: what a program does with ``$SHELL``
  (Codex runs its commands as ``bash -lc CMD``); ``-l`` makes bash a login shell.
* ``corral shell -- ARGV...``: ARGV as given, no shell.
* ``corral shell --prefix STRING``: for Claude Code's ``CLAUDE_CODE_SHELL_PREFIX``, which
  calls the prefix with ONE argument, the whole command string.  Claude's string sources
  its shell snapshot (``~/.claude/shell-snapshots/snapshot-*.sh``) and ends by writing the
  shell's final directory to ``$TMPDIR/claude-<id>-cwd``, which Claude reads afterwards;
  both live in places the sandbox hides.  So the snapshot is made visible read-only, and
  the cwd file, created here beforehand (as the user, never through a link), is bound
  writable at its own path: nothing else of the host's ``/tmp`` or home is.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

from ..errors import UsageError
from ..fsops import Tree
from ..record import NamedTuple

__all__ = ["Command", "from_prefix", "prepare", "shell_argv"]

# Claude Code's command string, as version 2.1 builds it (see docs/agents.md).
SNAPSHOT = re.compile(r"^source (/\S+/shell-snapshots/snapshot-[A-Za-z0-9._-]+\.sh) ")
CWD_FILE = re.compile(r"&& pwd -P >\| (/\S+/claude-[0-9a-f]+-cwd)\Z")


class Command(NamedTuple):
    """The sandbox's argv, and host paths it needs at the same path inside."""

    argv: list[str]
    read_only: tuple[str, ...] = ()
    writable_files: tuple[str, ...] = ()  # created by :func:`prepare` before the launch


def shell_argv(command: str, login: bool = False) -> list[str]:
    """``bash -c CMD`` (``-l``: a login shell), or ``sh -c`` where there is no bash."""
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    return [shell, *(["-l"] if login and shell == "/bin/bash" else []), "-c", command]


def from_prefix(words: Sequence[str]) -> Command:
    """The sandbox for ``corral shell --prefix STRING`` (pure: nothing is created)."""
    if len(words) != 1:
        raise UsageError(f"corral shell --prefix takes one argument, the command string "
                         f"(got {len(words)})",
                         "Claude Code passes the whole command as one argument",
                         "set CLAUDE_CODE_SHELL_PREFIX='corral shell --prefix'")
    string = words[0]
    snapshot = SNAPSHOT.match(string)
    cwd = CWD_FILE.search(string)
    # Claude's own path, at the start of its string (the model's command comes later,
    # quoted for eval); a link there is not followed onto something else.
    shown = snapshot.group(1) if snapshot else ""
    visible = shown and os.path.isfile(shown) and not os.path.islink(shown)
    return Command(shell_argv(string), read_only=(shown,) if visible else (),
                   writable_files=(cwd.group(1),) if cwd else ())


def prepare(files: Sequence[str], owner: tuple[int, int] | None) -> None:
    """Create each writable file, empty, where the command will write it.

    In a shared directory such as ``/tmp``, through its descriptor: a new name renamed
    into place (another user's file or link there cannot be replaced: the sticky bit), as
    ``owner`` when started by root.
    """
    for path in files:
        parent, name = os.path.split(path)
        try:
            with Tree(parent, owner) as tree:
                tree.write(name, b"", 0o600)
                st = tree.lstat(name)
        except OSError as e:
            raise UsageError(f"cannot create {path} for the command's final directory",
                             e.strerror or str(e), "remove what is in the way, or set "
                             "CLAUDE_CODE_TMPDIR to a directory of your own") from None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file", "something replaced it",
                             "run the command again")
