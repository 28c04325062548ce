"""Private state homes: corral's own copy of each agent's state (DESIGN, wave 2, root 4).

An agent's state is code: pi loads ``~/.pi/agent/extensions/*.ts``, Claude Code starts
the MCP servers in ``~/.claude.json`` and runs the hooks in ``~/.claude/settings.json``,
Codex reads ``[mcp_servers]`` from ``~/.codex/config.toml``, Gemini CLI loads
``~/.gemini/extensions``; every release adds another file it loads.  So the sandbox never
gets the real state folders.  Each agent profile has a copy that corral keeps per user,
``~/.local/state/corral/agents/<profile>/``, laid out like the home directory, and its
``[state] dirs`` are mounted writable from there.  Whatever the sandbox writes there only
ever runs inside corral.

The copy is made on first use, from the files the profile lists under ``import`` (the
settings and instructions a user wrote, never history or caches), and again on
``--import-state``.  ``credentials`` (the login) are copied in from the real files at every
launch and never written back: a login made inside corral stays in corral's copy, and
the real file is only ever read.

Nothing is mounted inside the copy, so bwrap creates no mount point in a tree the
sandbox can write; every file operation here goes through :mod:`corral.fsops` (no
symbolic link followed, on either side; as root, done as the agent's user).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence

from ..errors import UsageError
from ..fsops import Tree
from ..policy import Policy
from ..record import NamedTuple

__all__ = ["STORE", "StateDir", "check_apart", "plan", "prepare"]

STORE = ".local/state/corral/agents"  # beneath the agent's home directory
FILE_CAP = 16 << 20  # one imported file
TOTAL_CAP = 256 << 20  # one import, all files
ENTRY_CAP = 20_000  # one import, all entries
DEPTH_CAP = 32


class StateDir(NamedTuple):
    """One state folder: where it is seen inside, and corral's copy on the host."""

    dest: str  # absolute path inside (and of the real folder, which is never mounted)
    source: str  # corral's copy, a host path
    store_rel: str  # the copy, relative to the home directory


def _rel(path: str) -> str:
    return path[2:].rstrip("/")


def store_of(policy: Policy) -> str:
    """The copy's directory for this profile, relative to the home directory."""
    name = policy.name
    if not name or name.startswith(".") or "/" in name:
        raise UsageError(f"profile name {name!r} cannot name a state folder", "",
                         "rename the profile file")
    return f"{STORE}/{name}"


def plan(policy: Policy, home: str, covered: Sequence[str] = ()) -> list[StateDir]:
    """The state folders of ``policy`` (pure).  A folder within ``covered`` (a path the
    user made writable on purpose with ``--rw``) is left to that bind."""
    store = store_of(policy) if policy.state.dirs else ""
    out = []
    for d in policy.state.dirs:
        dest = os.path.join(home, _rel(d))
        if any(dest == c or dest.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        out.append(StateDir(dest, os.path.join(home, store, _rel(d)), f"{store}/{_rel(d)}"))
    return out


def check_apart(home: str, writable: Sequence[str]) -> None:
    """No writable tree may hold, or lie in, corral's copies of the agents' state: they
    hold every profile's login, and what one profile's copy holds runs in that agent."""
    store = os.path.realpath(os.path.join(home, STORE))
    for path in writable:
        if _inside(store, path) or _inside(path, store):
            raise UsageError(f"refusing to make {path} writable: it holds or lies in "
                             f"corral's copies of the agents' state ({store})",
                             "they hold every agent profile's login and code it runs",
                             "run from a project directory outside it")


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def prepare(policy: Policy, home: str, owner: tuple[int, int] | None, dirs: Sequence[StateDir],
            import_state: bool) -> list[str]:
    """Make corral's copy (importing on first use or when asked), refresh the credentials.

    Returns notes for the user: what was imported, and what was skipped and why.
    """
    if not dirs:
        return []
    try:
        with Tree(home, owner) as tree:
            first = tree.lstat(store_of(policy)) is None
            for d in dirs:
                tree.makedirs(d.store_rel, 0o700)
            notes: list[str] = []
            if first or import_state:
                wanted = [p for p in policy.state.imports if _within(p[1], home, dirs)]
                done, notes = _copy_all(tree, policy, wanted)
                if done:
                    notes.append(f"imported into corral's copy of the {policy.name} state "
                                 f"({os.path.join(home, store_of(policy))}): {', '.join(done)}")
            creds = [(c, c) for c in policy.state.credentials if _within(c, home, dirs)]
            return notes + _copy_all(tree, policy, creds)[1]
    except OSError as e:
        raise UsageError(f"cannot prepare corral's copy of the agent's state under "
                         f"{os.path.join(home, STORE)}", f"{e.strerror or e}"
                         + (f" ({e.filename})" if e.filename else ""),
                         "make sure that path is a plain directory you own (no symbolic "
                         "links), or pass --rw with the real state folder") from None


def _within(path: str, home: str, dirs: Sequence[StateDir]) -> bool:
    dest = os.path.join(home, _rel(path))
    return any(dest.startswith(d.dest + "/") for d in dirs)


def _copy_all(tree: Tree, policy: Policy, pairs: Sequence[tuple[str, str]]
              ) -> tuple[list[str], list[str]]:
    """Copy each real path (file or folder) to its place in the copy.

    Returns what was copied and notes on what was not.
    """
    done, notes = [], []
    budget = Budget()
    store = store_of(policy)
    for real, inside in pairs:
        src, dest = _rel(real), f"{store}/{_rel(inside)}"
        try:
            st = tree.lstat(src)
        except OSError as e:  # a symbolic link on the way: ELOOP
            notes.append(f"not imported {real}: {e.strerror}")
            continue
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            notes.append(f"not imported {real}: it is a symbolic link (copy the file itself)")
            continue
        skipped = _copy(tree, src, dest, st, budget)
        notes += [f"not imported {real}: {why}" for why in skipped]
        done.append(real)
    return done, notes


class Budget:
    """What one import may still copy: bytes and entries."""

    def __init__(self) -> None:
        self.bytes = TOTAL_CAP
        self.entries = ENTRY_CAP

    def take(self, size: int) -> bool:
        if self.entries <= 0 or size > self.bytes:
            return False
        self.entries -= 1
        self.bytes -= size
        return True


def _copy(tree: Tree, src: str, dest: str, st: os.stat_result, budget: Budget) -> list[str]:
    """Copy ``src`` to ``dest`` within ``tree``; returns why parts of it were skipped."""
    skipped = []
    for rel, mode, size in _walk(tree, src, st):
        target = dest + rel[len(src):]
        if size > FILE_CAP:
            skipped.append(f"{rel} is larger than {FILE_CAP >> 20} MiB")
            continue
        if not budget.take(size):
            return [*skipped, f"more than {TOTAL_CAP >> 20} MiB or {ENTRY_CAP} entries"]
        if stat.S_ISDIR(mode):
            tree.makedirs(target, 0o700)
            continue
        data = tree.read(rel, FILE_CAP)
        tree.makedirs(os.path.dirname(target), 0o700)
        if data is not None:  # None: replaced by something else meanwhile
            tree.write(target, data, 0o700 if mode & 0o100 else 0o600)  # private copy
    return skipped


def _walk(tree: Tree, top: str, st: os.stat_result, depth: int = 0
          ) -> Iterator[tuple[str, int, int]]:
    """Regular files and folders beneath ``top``, parents first (links, FIFOs, devices and
    sockets skipped)."""
    if stat.S_ISREG(st.st_mode):
        yield top, st.st_mode, st.st_size
        return
    if not stat.S_ISDIR(st.st_mode) or depth > DEPTH_CAP:
        return
    yield top, st.st_mode, 0
    for name in sorted(tree.listdir(top)):
        child = f"{top}/{name}"
        sub = tree.lstat(child)
        if sub is not None and not stat.S_ISLNK(sub.st_mode):
            yield from _walk(tree, child, sub, depth + 1)
