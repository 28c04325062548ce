"""MCP sessions' workspaces: one directory per session that persists across its tool calls,
removed when the session ends, when the server exits, or, after a server was killed, when
the next one starts.

Layout under the runs directory (every part of it the launcher's own, mode 0700, except the
workspaces, which belong to the uid the payload runs as)::

    RUNS/mcp-<id>/                 one server; its lock file is held (flock) while it lives
    RUNS/mcp-<id>/<session>/work   a session's workspace: /work in each of its sandboxes
    RUNS/mcp-<id>/<session>/<run>  the run record of each of its calls

A workspace is payload-writable: every file operation on it goes through
:mod:`corral.fsops` (descriptor walks, no link followed, FIFOs never opened, sizes capped,
as the workspace's owner when started by root); runs go through :func:`corral.execute.run_in`.
Nothing here knows about MCP itself: :mod:`corral.mcp.tools` translates tool calls into these
operations, :mod:`corral.mcp.server` wires them to the SDK.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

from .. import api, diskuse, execute, fsops, host, resolve, workspace
from ..errors import UsageError
from ..policy import Policy, check_path
from ..record import replace
from ..request import RunRequest
from ..result import RunResult

__all__ = ["Entry", "Server", "Session"]

MAX_READ = 1 << 20  # bytes read_file returns
MAX_LISTED = 1000  # entries list_files returns
MAX_LIST_DEPTH = 32  # directory levels list_files descends
LOCK = ".lock"


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a workspace listing.  Names are the payload's: untrusted data."""

    path: str
    type: str  # file, dir, symlink, fifo, socket, device, other
    size: int | None  # regular files only


class Session:
    """One MCP session's workspace and run records; see the module docstring.

    ``owner`` is who the workspace belongs to when started by root (the payload's uid and
    gid), else None.  Operations are blocking; :class:`Server` callers serialise them per
    session (one tool call at a time), so the workspace holds still between runs: nothing
    a run started survives it.
    """

    def __init__(self, root: str, owner: tuple[int, int] | None, policy: Policy,
                 env: tuple[tuple[str, str], ...] = ()) -> None:
        self.root = root
        self.env = env  # variables set inside every run (the server's --env)
        self.workspace = os.path.join(root, "work")
        self.runs = root  # the run records of its calls, beside the workspace
        self.owner = owner
        self.policy = policy
        os.mkdir(root, 0o700)
        os.mkdir(self.workspace, 0o700)
        if owner is not None:
            os.chown(self.workspace, *owner)

    def close(self) -> None:
        """Remove the session's directory: its workspace and records."""
        fsops.remove_tree(self.root)

    def _tree(self) -> fsops.Tree:
        return fsops.Tree(self.workspace, self.owner)

    def used(self) -> int:
        """Bytes the workspace takes up, as the disk limit counts them."""
        try:
            # A plain user's payload may have locked its owner out of a directory: the
            # measure gives the owner's rights back, as the run's own watch does.
            return diskuse.measure(self.workspace, restore=self.owner is None).bytes
        except (diskuse.Unmeasurable, OSError) as e:
            raise UsageError("the session's workspace cannot be measured", str(e),
                             "remove what the run left unreadable, or start a new session"
                             ) from None

    def _room(self, adding: int = 0) -> int | None:
        """Bytes the disk limit still allows the session's workspace, in all; None: no limit.

        The limit is on the session's whole workspace, not on each run: otherwise every call
        could add as much again.  Raises UsageError when ``adding`` would not fit."""
        limit = self.policy.limits.disk_bytes
        if limit is None:
            return None
        room = limit - self.used()
        if room <= adding:
            raise UsageError(f"the session's workspace is at its disk limit ({limit} bytes)",
                             f"{max(room, 0)} bytes are left and this needs {max(adding, 1)}",
                             "remove files with run_command, or start a new session")
        return room

    def run(self, request: RunRequest) -> RunResult:
        """Run ``request`` in the workspace under the server's policy, its limits capped."""
        placing = sum(len(c) for _, c in request.files) \
            + len((request.code or "").encode(errors="replace"))
        try:
            room = self._room(placing)
        except UsageError as e:
            return RunResult.refused(request.id, "invalid", str(e))
        policy = self.policy
        if room is not None:  # the run's own limit counts from after the files are placed
            policy = replace(policy, limits=replace(policy.limits, disk_bytes=room - placing))
        return execute.run_in(replace(request, env=self.env), policy, self.workspace,
                              owner=self.owner, runs_dir=self.runs)

    def read(self, rel: str) -> bytes:
        """The regular file ``rel`` of the workspace, at most MAX_READ bytes."""
        with self._tree() as tree:
            st = self._existing(tree, rel, "read")
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"cannot read {rel!r}", f"it is a {_kind(st.st_mode)}, not a "
                                 "regular file", "read regular files only; list_files shows "
                                 "what is there")
            try:
                data = tree.read(rel, MAX_READ)
            except OSError as e:
                if e.errno == errno.EFBIG:
                    raise UsageError(f"cannot read {rel!r}", f"it holds {st.st_size} bytes, "
                                     f"more than read_file returns ({MAX_READ})", "read a "
                                     "part with run_command, e.g. head -c 100000") from None
                raise _refused("read", rel, e) from None
        if data is None:
            raise UsageError(f"cannot read {rel!r}", "it changed while corral read it", "")
        return data

    def write(self, rel: str, data: bytes) -> int:
        """Write ``data`` to ``rel`` (creating its directories); returns the size written."""
        self._room(len(data))
        with self._tree() as tree:
            st = _lstat(tree, rel, "write")
            if st is not None and not stat.S_ISREG(st.st_mode):
                kind = "symbolic link" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
                raise UsageError(f"cannot write {rel!r}", f"it is a {kind}; the file tools "
                                 "replace regular files only, and never follow links",
                                 "remove it with run_command first")
            try:
                if "/" in rel:
                    tree.makedirs(rel.rsplit("/", 1)[0])
                tree.write(rel, data, 0o644)
            except OSError as e:
                raise _refused("write", rel, e) from None
        return len(data)

    def listing(self, rel: str) -> tuple[list[Entry], bool]:
        """Entries beneath directory ``rel`` ("" is the workspace), depth first, sorted;
        and whether the listing was cut at MAX_LISTED entries or MAX_LIST_DEPTH levels."""
        out: list[Entry] = []
        with self._tree() as tree:
            if rel:
                st = self._existing(tree, rel, "list")
                if not stat.S_ISDIR(st.st_mode):
                    raise UsageError(f"cannot list {rel!r}", f"it is a {_kind(st.st_mode)}",
                                     "name a directory, or leave path out for the workspace")
            try:
                complete = _walk(tree, rel, 0, out)
            except OSError as e:
                raise _refused("list", rel or ".", e) from None
        return out, not complete

    def _existing(self, tree: fsops.Tree, rel: str, verb: str) -> os.stat_result:
        st = _lstat(tree, rel, verb)
        if st is None:
            raise UsageError(f"cannot {verb} {rel!r}", "no such file or directory",
                             "list_files shows what is there")
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"cannot {verb} {rel!r}", "it is a symbolic link, and the file "
                             "tools never follow links", "read its target's path instead, "
                             "if it is inside the workspace")
        return st


def _lstat(tree: fsops.Tree, rel: str, verb: str) -> os.stat_result | None:
    try:
        return tree.lstat(rel)
    except OSError as e:
        raise _refused(verb, rel, e) from None


def _refused(verb: str, rel: str, e: OSError) -> UsageError:
    return UsageError(f"cannot {verb} {rel!r}", fsops.reason(e),
                      "use a plain path inside the workspace, with no symbolic link on the way")


def _walk(tree: fsops.Tree, rel: str, depth: int, out: list[Entry]) -> bool:
    """Append the entries beneath ``rel`` to ``out``; False when a bound cut it short.

    Each name is looked at through the tree (never through a link); a directory swapped
    for a link meanwhile is listed as what it is now and not entered."""
    for name in sorted(tree.listdir(rel)):
        if len(out) >= MAX_LISTED:
            return False
        path = f"{rel}/{name}" if rel else name
        st = tree.lstat(path)
        if st is None:
            continue  # gone meanwhile
        kind = _kind(st.st_mode)
        out.append(Entry(os.fsdecode(os.fsencode(path)), kind,
                         st.st_size if kind == "file" else None))
        if kind == "dir":
            if depth + 1 >= MAX_LIST_DEPTH:
                return False
            if not _walk(tree, path, depth + 1, out):
                return False
    return True


def _kind(mode: int) -> str:
    return workspace.kind(mode)


def _make_root(base: str) -> str:
    """A fresh ``mcp-<id>`` directory of the launcher's own in the runs directory."""
    check_path(os.path.abspath(base), "runs directory")
    root = os.path.join(base, f"mcp-{workspace.new_run_id()}")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        os.mkdir(root, 0o700)
    except OSError as e:
        raise UsageError(f"cannot create the server's directory in {base}",
                         e.strerror or str(e), "pass --runs-dir DIR or set CORRAL_RUNS_DIR to "
                         "a writable directory") from None
    return root


class Server:
    """The sessions of one MCP server: a directory of its own, held by a lock while it
    lives; sessions made and removed in it.  :meth:`close` removes whatever is left.

    Construction checks that the policy can be enforced on this host (fail closed: the
    server does not start, rather than fail every call) and removes what servers that died
    without cleaning up left in the same runs directory.
    """

    def __init__(self, policy: Policy, runs_dir: str | None = None,
                 max_sessions: int | None = None,
                 env: tuple[tuple[str, str], ...] = ()) -> None:
        api.plan(["/bin/true"], policy, runs_dir=runs_dir, env=env)  # every check a run makes
        facts = host.detect()
        self.policy = policy
        self.env = env
        self.max_sessions = max_sessions
        self.owner = resolve.sandbox_identity(policy, facts, None) if facts.is_root else None
        base = runs_dir or workspace.default_runs_dir()
        sweep(base)
        self.root = _make_root(base)
        self._lock_fd = _hold(self.root)
        self._mutex = threading.Lock()
        self.sessions: dict[str, Session] = {}

    def open(self) -> Session:
        """A new session with an empty workspace; UsageError when too many are open."""
        with self._mutex:
            if self.max_sessions is not None and len(self.sessions) >= self.max_sessions:
                raise UsageError(f"{len(self.sessions)} sessions are open, the most this "
                                 "server allows", "each session keeps a workspace",
                                 "end another session, or start the server with a higher "
                                 "--max-sessions")
            name = os.urandom(8).hex()
            session = Session(os.path.join(self.root, name), self.owner, self.policy, self.env)
            self.sessions[name] = session
            return session

    def end(self, session: Session) -> None:
        """Remove ``session``'s workspace and records (once: again does nothing)."""
        with self._mutex:
            if self.sessions.pop(os.path.basename(session.root), None) is None:
                return
        session.close()

    def close(self) -> None:
        """Remove every session, then the server's own directory (once)."""
        for session in list(self.sessions.values()):
            self.end(session)
        if self._lock_fd >= 0:
            fsops.remove_tree(self.root)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _hold(root: str) -> int:
    """Lock ``root``'s lock file for the life of this process (the lock goes with it).

    Locked under a fresh name, then renamed into place: a sweeper that finds the lock file
    always finds it held."""
    temp = os.path.join(root, f"{LOCK}-{os.urandom(6).hex()}")
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(temp, os.path.join(root, LOCK))
    return fd


def sweep(base: str) -> list[str]:
    """Remove the directories of MCP servers in ``base`` that are gone; returns them.

    A server holds its lock until its process ends, however it ends; a lock that can be
    taken belongs to a dead server.  A directory without a lock file is one whose server
    was killed while starting, or one being created right now: it is left alone, since
    the two cannot be told apart."""
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    removed = [n for n in names if n.startswith("mcp-") and _abandoned(os.path.join(base, n))]
    for name in removed:
        fsops.remove_tree(os.path.join(base, name))
    return removed


def _abandoned(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its server lives
    finally:
        os.close(fd)
    return True
