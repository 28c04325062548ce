"""git's in-progress state: what a later host git command resumes, and would run.

A rebase, cherry-pick, revert or ``git am`` that stops half-way leaves its state in the git
directory (each worktree's own: ``.git/worktrees/NAME/`` too); the host's git picks it up
again when the user runs ``git rebase --continue``, ``git cherry-pick --continue`` or
``git am --skip`` (what ``git status`` suggests).  Most of that state is data (commits,
messages, refs).  What git 2.39 was seen to turn into a program or a write outside the
project, each reproduced in ``tests/test_agent_gitstate.py``:

* ``rebase-merge/git-rebase-todo``: ``exec``/``x`` lines, run through the shell;
* ``rebase-merge/strategy``, ``rebase-apply/strategy`` and ``options.strategy`` in
  ``sequencer/opts``: a strategy git does not build in is run as ``git-merge-NAME``, and
  ``x/../evil`` makes that a path relative to the work tree's top;
* ``rebase-apply/apply-opt``: options for ``git apply``, among them
  ``--build-fake-ancestor=FILE``, which writes FILE wherever it says.

:func:`commands` names each such thing; :mod:`corral.audit` quarantines a state folder
that holds one the launch did not.  Reads go through :mod:`corral.fsops`; what cannot be
read as a plain file counts as a command (git follows links there, corral does not).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable

from . import fsops, gitconfig

__all__ = ["RESUME", "at_launch", "commands", "why"]

# The state folders and the command that resumes each on the host.
RESUME = {"rebase-merge": "git rebase --continue", "rebase-apply": "git am (or rebase) --continue",
          "sequencer": "git cherry-pick (or revert) --continue"}
# Strategies git runs itself (ort, recursive, ours, subtree) or ships (resolve, octopus).
STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
# What git am itself writes to apply-opt (builtin/am.c's pass-through options).
APPLY_OPT = re.compile(rb"--whitespace=.*|--ignore-space-change|--ignore-whitespace|"
                       rb"--directory=.*|--exclude=.*|--include=.*|-C[0-9]*|-p[0-9]*|--reject",
                       re.S)
EXEC = re.compile(rb"[ \t]*(exec|x)(?:[ \t\r]|$)")  # sequencer.c's is_command
SQ_WORD = rb"'(?:[^']|'\\[!']')*'"  # quote.c's sq_dequote_step: 'a'\''b'
SQ_WORDS = re.compile(rb"[ \t\n\r\f\v]*(" + SQ_WORD + rb"(?:[ \t\n\r\f\v]+" + SQ_WORD +
                      rb")*)?[ \t\n\r\f\v]*")
# A strategy file as git reads it (strbuf_trim_trailing_newline): one name, one newline.
STRATEGY_FILES = frozenset(s.encode() + end for s in (*STRATEGIES, "")
                           for end in (b"", b"\n", b"\r\n"))
CAP = 1 << 20  # bytes of one state file read; a larger one counts as a command
UNREADABLE = "a file corral cannot read as git would"


def commands(tree: fsops.Tree, gitdir: str) -> dict[str, frozenset[str]]:
    """{state folder (relative to ``tree``): what in it host git would run}, for each state
    folder of ``gitdir`` that holds something."""
    found = {}
    for name in RESUME:
        rel = f"{gitdir}/{name}"
        try:
            st = tree.lstat(rel)
            if st is None:
                continue
            what = _folder(tree, rel, name) if stat.S_ISDIR(st.st_mode) else {
                f"a {fsops.kind_of(st.st_mode)} git would follow {_version(st)}"}
        except OSError:
            what = {_unreadable(tree, rel)}
        if what:
            found[rel] = frozenset(what)
    return found


def _folder(tree: fsops.Tree, rel: str, name: str) -> set[str]:
    what = set()
    if name == "rebase-merge":
        lines = _todo(tree, f"{rel}/git-rebase-todo")
        what |= {_unreadable(tree, f"{rel}/git-rebase-todo")} if lines is None else {
            f"exec {line!r}" for line in lines}
    if name in ("rebase-merge", "rebase-apply"):
        data = _read(tree, f"{rel}/strategy")
        if data is None:
            what.add(_unreadable(tree, f"{rel}/strategy"))
        elif data not in STRATEGY_FILES:
            what.add(f"strategy {data!r}")
    if name == "rebase-apply":
        opts = _apply_opts(tree, f"{rel}/apply-opt")
        what |= {_unreadable(tree, f"{rel}/apply-opt")} if opts is None else {
            f"git apply option {w!r}" for w in opts}
    if name == "sequencer":
        values = _opts(tree, f"{rel}/opts")
        what |= {_unreadable(tree, f"{rel}/opts")} if values is None else {
            f"strategy {v!r}" for v in values}
    return what


def _version(st: os.stat_result) -> str:
    """Which inode, changed when: what cannot be read is the launch's only if it is the
    very same, unchanged (a link replaced by another link is new)."""
    return f"(inode {st.st_ino}, changed {st.st_ctime_ns})"


def _unreadable(tree: fsops.Tree, rel: str) -> str:
    try:
        st = tree.lstat(rel)
    except OSError:
        st = None
    return f"{UNREADABLE}: {os.path.basename(rel)} {_version(st) if st else ''}".rstrip()


def _read(tree: fsops.Tree, rel: str) -> bytes | None:
    """A state file's bytes; b"" when absent; None when git might read it but corral
    cannot (a link, a FIFO, too large)."""
    try:
        if tree.lstat(rel) is None:
            return b""
        return tree.read(rel, CAP)
    except OSError:
        return None


# What is named is compared with what the launch held, so each is the exact bytes (a
# prefix or a lossy decoding would let a new command pass for the user's own).

def _todo(tree: fsops.Tree, rel: str) -> list[bytes] | None:
    data = _read(tree, rel)
    if data is None or b"\0" in data:  # git stops reading a line at a NUL: do not guess
        return None
    return [line for line in data.split(b"\n") if EXEC.match(line)]


def _apply_opts(tree: fsops.Tree, rel: str) -> list[bytes] | None:
    data = _read(tree, rel)
    if data is None:
        return None
    match = SQ_WORDS.fullmatch(data)
    if match is None:
        return [data]
    words = re.findall(SQ_WORD, match.group(1) or b"")
    values = [w[1:-1].replace(b"'\\''", b"'").replace(b"'\\!'", b"!") for w in words]
    return [v for v in values if not APPLY_OPT.fullmatch(v)]


def _opts(tree: fsops.Tree, rel: str) -> list[str] | None:
    data = _read(tree, rel)
    try:
        entries = gitconfig.parse(data) if data is not None else None
    except gitconfig.ConfigError:
        entries = None
    if entries is None:
        return None
    return [v or "" for n, v in entries if n == "options.strategy" and v not in STRATEGIES]


def why(state: str, what: Iterable[str]) -> str:
    """The audit's reason for quarantining ``state``, with how to get it back."""
    name = os.path.basename(state)
    shown = "; ".join(w if len(w) <= 100 else w[:97] + "..." for w in sorted(what)[:3])
    return (f"git's {name} state, made or changed during the run, would run what the run "
            f"chose ({shown}) at `{RESUME[name]}` on the host: read it, then move it back "
            "to resume, or leave it and check out your branch")


def at_launch(trees: Iterable[tuple[str, tuple[int, int] | None]], gitdirs: Iterable[str]
              ) -> dict[str, frozenset[str]]:
    """{state folder (absolute): its commands} of the git directories at launch: what
    the user left there is theirs, and the audit does not take it."""
    found: dict[str, frozenset[str]] = {}
    dirs = sorted(gitdirs)
    for top, owner in trees:
        inside = [g for g in dirs if g == top or g.startswith(top.rstrip("/") + "/")]
        if not inside:
            continue
        try:
            with fsops.Tree(top, owner) as tree:
                for g in inside:
                    for rel, what in commands(tree, os.path.relpath(g, top)).items():
                        found[tree.path(rel)] = what
        except OSError:
            continue  # the audit then takes whatever it finds there
    return found
