"""What in a git directory sends host git elsewhere: other objects, other remotes, other
commits than the ones it pushes.

Beyond its config, hooks and in-progress state (:mod:`corral.gitstate`), git 2.39 obeys
these files of a git directory, each reproduced from a ``corral agent`` run in
``tests/test_agent_gitredirect.py``:

* ``objects/info/alternates`` and ``objects/info/http-alternates``: git reads objects
  from any store they name, one the sandbox never showed (a ref the agent writes then
  names another repository's commits, which ``git push`` sends on);
* the legacy ``remotes/NAME`` and ``branches/NAME``: the URL of a remote the config does
  not name, ``origin`` included, so a plain ``git push`` sends the user's code (and the
  credential helper's answer) where the agent chose;
* ``refs/replace/*``, loose or in ``packed-refs``, and ``info/grafts``: ``git log``,
  ``git show``, ``git diff`` and even ``git checkout`` show another commit (or other
  parents) than the one ``git push`` sends, so what the user reviews is not what leaves.

None of it is written by an agent's ordinary work (git itself never writes the legacy
remotes, grafts or alternates but at ``git clone --shared``, and replace refs only at
``git replace``), so :func:`planted` names each such file made or changed during the run;
the audit quarantines it.  A ``packed-refs`` holding replace refs is quarantined and put
back without them, so the run's other refs stay.  Reads go through :mod:`corral.fsops`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator

from . import fsops
from .fswalk import join, walk

__all__ = ["planted"]

ELSEWHERE = "git would read objects from the store it names, one the sandbox never showed"
ALTERNATES = ("objects/info/alternates", "objects/info/http-alternates")
LEGACY = ("`git push`, `git fetch` and `git pull` (for `origin` too, when the config "
          "names none) would send to the URL it holds, the agent's choice")
REPLACED = ("git log, show, diff and checkout would show another {} than the one git push "
            "sends")
REPLACE = "refs/replace"
PACKED_CAP = 64 << 20  # bytes of a packed-refs read; a larger changed one is taken whole
WALK_CAP = 100_000  # entries of refs/replace, remotes/ or branches/ walked

Changed = Callable[[os.stat_result | None], bool]


def planted(tree: fsops.Tree, gitdir: str, changed: Changed
            ) -> Iterator[tuple[str, str, bytes | None]]:
    """(path relative to ``tree``, why, what to put back or None) for each file of
    ``gitdir`` that redirects host git and was made or changed during the run."""
    for name, why in ((ALTERNATES[0], ELSEWHERE), (ALTERNATES[1], ELSEWHERE),
                      ("info/grafts", f"grafts: {REPLACED.format('history')}")):
        st, link = _reach(tree, gitdir, name, changed)
        if link or changed(st):
            yield link or f"{gitdir}/{name}", why, None
    for folder, why in (("remotes", f"a legacy remote: {LEGACY}"),
                        ("branches", f"a legacy remote: {LEGACY}"),
                        (REPLACE, f"a replace ref: {REPLACED.format('commit')}")):
        yield from ((rel, why, None) for rel in _files(tree, gitdir, folder, changed))
    packed = f"{gitdir}/packed-refs"
    verdict = _packed(tree, packed, changed)
    if verdict is not None:
        yield packed, f"it holds replace refs: {REPLACED.format('commit')}", verdict or None


def _reach(tree: fsops.Tree, gitdir: str, name: str, changed: Changed
           ) -> tuple[os.stat_result | None, str | None]:
    """(``name`` itself or None, a link made during the run on the way to it): git
    follows links (``objects`` or ``objects/info`` made one), corral's walk does not.
    A link the launch held is the user's own, and what lies beyond it is left alone."""
    parts = name.split("/")
    for i in range(1, len(parts) + 1):
        rel = "/".join([gitdir, *parts[:i]])
        try:
            st = tree.lstat(rel)
        except OSError:
            return None, None  # only a link before it does that: already returned
        if st is None:
            return None, None
        if stat.S_ISLNK(st.st_mode) and i < len(parts):
            return None, rel if changed(st) else None
    return st, None


def _files(tree: fsops.Tree, gitdir: str, folder: str, changed: Changed) -> Iterator[str]:
    """What git reads under ``folder`` that changed: a link or file in its place (git
    follows links there) is taken whole; a folder is walked, every entry but folders."""
    st, link = _reach(tree, gitdir, folder, changed)
    top = link or f"{gitdir}/{folder}"
    if link or st is None or not stat.S_ISDIR(st.st_mode):
        if link or changed(st):
            yield top
        return
    try:
        for here, entries in walk(tree, top, limit=WALK_CAP, stats=True):
            yield from (join(here, e.name) for e in entries
                        if e.kind != "dir" and changed(e.st))
    except OSError:
        yield top  # a folder corral cannot walk as git would: all of it goes


def _packed(tree: fsops.Tree, rel: str, changed: Changed) -> bytes | None:
    """None: leave ``packed-refs`` (unchanged, or no replace ref in it); b"": take it
    whole (git follows a link there, and corral cannot read a FIFO or a huge one as git
    would); else its bytes without the replace refs and their peeled lines."""
    try:
        if not changed(tree.lstat(rel)):
            return None
        data = tree.read(rel, PACKED_CAP)
    except OSError:
        data = None
    if data is None:
        return b""
    keep, dropping = [], False
    for line in data.splitlines(keepends=True):
        if line.startswith(b"^"):  # the peeled value of the ref just before
            keep += [] if dropping else [line]
            continue
        dropping = line.split(b" ", 1)[-1].startswith(REPLACE.encode() + b"/")
        keep += [] if dropping else [line]
    kept = b"".join(keep)
    return None if kept == data else kept
