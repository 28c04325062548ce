"""Per-run directories, staging inputs in, and collecting results out.

Layout: ``RUNS/<run-id>/work`` is the workspace (mounted at ``/work``) and
``RUNS/<run-id>/record.json`` the run record.  A reused workspace
(``--workspace DIR``) keeps its place; its record still goes under RUNS.

Everything in a workspace is untrusted once a payload has run there.  Every
walk here goes through directory descriptors with ``O_NOFOLLOW``, opens
files with ``O_NONBLOCK`` (a FIFO never blocks us), checks the type after
opening, and caps how much it reads, hashes and lists.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from . import fsops, jsonio, small
from .errors import UsageError
from .fswalk import remove
from .policy import check_path
from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

__all__ = ["Change", "RunDir", "collect", "default_runs_dir", "prepare", "quarantine",
           "record_dir", "snapshot", "write_record"]

MAX_ENTRIES = 100_000  # entries walked
MAX_LISTED = 10_000  # changes listed in the record
MAX_DEPTH = 256  # levels: one descriptor each is open during the walk
MAX_PATH_BYTES = 32 << 20  # path names walked, in all: long names must not exhaust memory
MAX_LISTED_BYTES = 4 << 20  # path names listed in the record and the result
MAX_HASHED = 1 << 30  # bytes hashed per collection; beyond it sha256 is null
BLOCK = 4096  # what an entry costs on disk at least
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Stamp = tuple[str, int, int, int, int]  # type, size, mtime_ns, ctime_ns, inode


class Change(NamedTuple):
    """One path the run created, modified or deleted, as found after the run."""

    path: str  # relative to the workspace; from untrusted names
    change: str  # created, modified, deleted
    type: str  # file, dir, symlink, fifo, socket, device, other
    size: int | None = None
    sha256: str | None = None
    target: str | None = None  # a symlink's target, never followed

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self._asdict().items() if v is not None}


class RunDir(NamedTuple):
    run_id: str
    root: str  # RUNS/<run-id>
    workspace: str  # the directory mounted at /work
    fresh: bool  # created for this run

    @property
    def record_path(self) -> str:
        return os.path.join(self.root, "record.json")


def default_runs_dir() -> str:
    """``$CORRAL_RUNS_DIR``; else ``/var/lib/corral/runs`` for root, the XDG state dir otherwise."""
    if os.environ.get("CORRAL_RUNS_DIR"):
        return os.environ["CORRAL_RUNS_DIR"]
    if os.geteuid() == 0:
        return "/var/lib/corral/runs"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "corral", "runs")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(4).hex()


def is_run_id(name: str) -> bool:
    """Whether ``name`` has :func:`new_run_id`'s form (YYYYmmddTHHMMSS-8 hex digits)."""
    stamp, dash, tail = name.partition("-")
    return (len(stamp) == 15 and stamp[8] == "T" and (stamp[:8] + stamp[9:]).isdecimal()
            and stamp.isascii() and dash == "-" and len(tail) == 8
            and all(c in "0123456789abcdef" for c in tail))


def check_inputs(inputs: Sequence[str]) -> list[str]:
    """Absolute, existing input paths; raises before anything is created."""
    checked = []
    for item in inputs:
        path = os.path.abspath(item)
        check_path(path, "input")
        if not os.path.lexists(path):
            raise UsageError(f"input {item} does not exist", "--input copies a host path in",
                             "check the path")
        name = os.path.basename(path.rstrip("/"))
        if name in ("", ".", ".."):
            raise UsageError(f"input {item} has no usable name", "", "name a file or directory")
        checked.append(path)
    return checked


def input_bytes(inputs: Sequence[str]) -> int:
    """What ``inputs`` take on disk, at least a block per entry (links never followed)."""
    total = 0
    for src in inputs:
        todo = [src]
        while todo:
            path = todo.pop()
            st = os.lstat(path)
            total += max(st.st_blocks * 512, BLOCK)
            if stat.S_ISDIR(st.st_mode):
                todo.extend(os.path.join(path, name) for name in os.listdir(path))
    return total


MAX_LINKS = 40  # as the kernel: past it, ELOOP


@small.contextmanager
def claimed(run_root: str) -> Iterator[None]:
    """A run's own new folder (``RUNS/<id>``, its fresh workspace inside), held exclusively
    while the run lives: a launch reading through it (an ``--input`` by a path that leads
    into another run's live workspace) is refused as one through any tree a sandbox writes
    (review 8 read a host secret in, through a plain user's fresh workspace)."""
    fd = os.open(run_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    keys: list[str] = []
    try:
        _lock(fd, fcntl.LOCK_EX, run_root, f"{run_root} is being read by another corral "
              "run")
        keys = fsops.hold([run_root], fd)  # reached through fd from now on (fsops._HELD)
        yield
    finally:
        fsops.release(keys, fd)
        os.close(fd)


@small.contextmanager
def held(paths: Sequence[str], reads: Sequence[str] = ()) -> Iterator[list[str]]:
    """The host trees one run's sandbox will write, held against every other corral run
    whose sandbox could write any part of them, from its census to its audit; yields
    them resolved, as locked: the run uses those paths and no other.

    Two sandboxes writing one tree undo each other's audits: the second launch census
    backed up the first's plant, the first's audit quarantined it, and the second's audit
    put it back (reviews 4 to 6: the same workspace, nested workspaces, an agent with a
    ``--workspace`` run in its project, a workspace named through a link another sandbox
    repointed).  So each tree is locked (``flock``, which no sandbox can take from us: it
    never sees these descriptors) exclusively, and every folder on the way to it shared,
    on the path as given (each link's folder and its target's) and as resolved: a run on
    a folder above, below or the same, or on a link in a tree another run writes, finds
    a lock it cannot take, and refuses to start (exit 125).  A tree that cannot be opened
    for the lock is refused, never run unheld, and so is a folder on the way that is the
    user's own and unreadable (a payload can make its own tree so); one of another user's
    that this user cannot read is passed over (docs/threat-model.md).

    ``reads`` are host paths the launch reads or shows by path (``--input`` copies,
    ``--ro`` paths): every folder on the way to each, and the path itself when a folder,
    is held shared, so that no sandbox writes them while this run holds them (review 7:
    a live agent swapped a link onto ``/etc`` into the folder another run copied in as
    root, and its payload read ``/etc/shadow``)."""
    fds: list[int] = []
    anchors: list[tuple[list[str], int]] = []
    try:
        own: set[tuple[int, int]] = set()
        trees: list[str] = []
        ways = [_walk(given) for given in paths]
        for given, (tree, _) in zip(paths, ways, strict=True):
            try:
                fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                raise UsageError(f"cannot lock {tree} for this run", e.strerror or str(e),
                                 "a run holds the folders its sandbox writes; check the "
                                 "folder's mode (a payload may have changed it)") from None
            fds.append(fd)
            _lock(fd, fcntl.LOCK_EX, tree, f"{tree} is in use by another corral run (in it, "
                  "or in a folder inside it)")
            st = os.fstat(fd)
            with small.suppress(OSError):
                now = os.stat(given)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    own.add((st.st_dev, st.st_ino))
                    trees.append(tree)
                    # From now on the run reaches it through fd, by either name: the
                    # folders above may be someone else's to rename (fsops._HELD).
                    anchors.append((fsops.hold([given, tree], fd), fd))
                    continue
            raise UsageError(f"{given} changed while it was being locked",
                             "a link on its way points elsewhere now",
                             "name the folder itself, by a path no sandbox can write")
        for tree, folders in ways:
            for up in folders:
                _share(up, tree, own, fds, f"{up}, on the way to {tree}, is in use by "
                       "another corral run", missing_ok=False)
        for given in reads:
            real, folders = _walk(given)
            for up in [*folders, *([real] if os.path.isdir(real) else [])]:
                _share(up, given, own, fds, f"{given} is read through {up}, which another "
                       "corral run's sandbox writes", missing_ok=True)
        yield trees
    finally:
        for keys, fd in anchors:
            fsops.release(keys, fd)
        for fd in fds:
            os.close(fd)


def check_runs_dir(runs_dir: str) -> None:
    """The runs directory, and every folder on the way to it, belongs to the launcher's
    user or root, and no one else can rename what is in it (group or world write only with
    the sticky bit).  corral writes records, quarantines and fresh workspaces there by
    name (review 42: in a folder another user could write, that user swapped ``RUNS/<id>``
    for a link, and root wrote its record and the audit's quarantine, and bound the fresh
    workspace, where the link led; a plain user's sandbox got that user's folder)."""
    check_way(runs_dir, os.geteuid(), f"the runs directory {runs_dir}",
              "corral writes records, quarantines and fresh workspaces there by name",
              "choose a runs directory of your own (--runs-dir or CORRAL_RUNS_DIR)")


def check_way(path: str, uid: int, what: str, why: str, fix: str) -> None:
    """Every folder ``path`` is looked up through (each link's folder and its target's
    too), and ``path`` itself, belongs to ``uid`` or root and is written by no one else
    (world write only with the sticky bit, group write with it or in the owner's private
    group), and so does every link on the way:
    no other user can send the path elsewhere (review 43: a link of another user's in a
    sticky folder, /tmp, which its owner may repoint at any time).  Refused (UsageError)
    otherwise, naming the folder or link."""
    links: list[tuple[str, int]] = []
    real, folders = _walk(path, links)
    for link, owner in links:
        if owner not in (0, uid):
            raise UsageError(f"{what} is reached through the link {link}, which uid "
                             f"{owner} owns", f"{why}: no other user may send the path "
                             "elsewhere", fix)
    for folder in [*folders, real]:
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            continue  # made by this launcher, below a folder that passed
        except OSError as e:
            raise UsageError(f"cannot check {folder}, on the way to {what}",
                             e.strerror or str(e), fix) from None
        writers = st.st_mode & 0o002 or (st.st_mode & 0o020 and not _private_group(st))
        others = writers and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, uid) or others:
            who = f"uid {st.st_uid} owns" if st.st_uid not in (0, uid) else \
                "others may write without the sticky bit"
            raise UsageError(f"{what} is reached through {folder}, which {who}",
                             f"{why}: no other user may rename anything on the way", fix)


def _private_group(st: os.stat_result) -> bool:
    """The folder's group is its owner's own (a user-private group, no other member):
    group write then gives no one else anything (Debian and Ubuntu's usergroups umask 002
    makes home folders such as ~/.local group-writable)."""
    import grp
    import pwd

    try:
        owner = pwd.getpwuid(st.st_uid)
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return owner.pw_gid == st.st_gid and all(m == owner.pw_name for m in group.gr_mem)


def check_runs_apart(runs_dir: str, trees: Sequence[str]) -> None:
    """The runs directory never inside a tree a sandbox of this run writes: the launcher
    writes the record and moves what the audit quarantines there by path, and the payload
    could swap a link in (it sent a run's quarantine and record out of the project)."""
    runs, folders = _walk(runs_dir)
    for tree in trees:
        top = os.path.realpath(tree)
        # Through a link in the tree too (review 8): the payload could repoint it.
        if any(p == top or p.startswith(top.rstrip("/") + "/") for p in [runs, *folders]):
            raise UsageError(f"the runs directory {runs_dir} is inside {tree}, which the "
                             "sandbox writes", "corral writes records and moves quarantined "
                             "files there", "choose another (--runs-dir or CORRAL_RUNS_DIR)")


def settled(path: str) -> str:
    """``path`` (absolute) with its folder resolved, links followed, and its own name kept
    (a link there is copied as one): taken while held() holds it, it is where the path led
    under the locks, and what the copy opens with no link followed (:func:`copy_in`)."""
    parent, name = os.path.split(path.rstrip("/"))
    return os.path.join(_walk(parent or "/")[0], name)


def _walk(given: str, links_seen: list[tuple[str, int]] | None = None
          ) -> tuple[str, list[str]]:
    """``given`` resolved as the kernel resolves it, one name at a time, and every folder
    a name was looked up in on the way there: the folders above it, each link's folder,
    and every folder its target passes through.  A sandbox that writes any of them could
    send the path elsewhere; :func:`os.path.realpath` names only where the path ends up
    (review 8: a link to a link another run's sandbox made, in its live workspace).  The
    folders come out closed upwards (each one's are there too).  A part that is missing
    or cannot be looked at ends the walk: what is beyond names nothing yet.
    ``links_seen``, when given, gets each link on the way and its owner's uid."""
    rest = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    todo = [p for p in rest.split("/") if p]
    here, links, folders = "/", 0, {"/": None}
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            here = os.path.dirname(here)
            continue
        folders[here] = None
        nxt = os.path.join(here, part)
        if nxt == "/proc" or here.startswith("/proc"):
            # Its links (/proc/PID/root, /proc/PID/cwd) are not paths: the kernel follows
            # them into another process's view, which no walk of their text can hold.
            raise UsageError(f"{given} goes through /proc", "corral holds a path by the "
                             "folders it passes through, and /proc's links name none",
                             "name the file by its own path")
        try:
            st = os.lstat(nxt)
        except OSError:
            return os.path.join(nxt, *todo), list(folders)
        if stat.S_ISLNK(st.st_mode):
            if links_seen is not None:
                links_seen.append((nxt, st.st_uid))
            links += 1
            if links > MAX_LINKS:
                raise UsageError(f"{given} goes through more than {MAX_LINKS} symbolic "
                                 "links", "", "name the folder itself")
            target = os.readlink(nxt)
            todo = [p for p in target.split("/") if p] + todo
            here = "/" if target.startswith("/") else here
            continue
        here = nxt
    return here, list(folders)


def _share(up: str, target: str, own: set[tuple[int, int]], fds: list[int], busy: str,
           *, missing_ok: bool) -> None:
    """The folder ``up``, on the way to ``target``, held shared (once, and never one of
    the run's own trees); with ``missing_ok`` (a path read, not a tree written) one that
    is not there is passed over (a folder above it is held); an unreadable one of another
    user's is passed over; the user's own, or one gone from a tree's way, is refused."""
    try:
        fd = os.open(up, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        if missing_ok and isinstance(e, (FileNotFoundError, NotADirectoryError)):
            return
        if _mine(up):
            raise UsageError(f"cannot lock {up}, on the way to {target}", e.strerror or str(e),
                             "it is yours, and a run must hold it: give yourself read "
                             "permission on it (a sandbox's payload may have taken it away)"
                             ) from None
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in own:
        os.close(fd)
        return
    own.add((st.st_dev, st.st_ino))
    fds.append(fd)
    _lock(fd, fcntl.LOCK_SH, up, busy)


def _mine(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return True  # cannot tell: refused


def _lock(fd: int, how: int, path: str, busy: str) -> None:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(busy, "two sandboxes writing one tree would undo each other's "
                         "audits", "wait for that run to end, or use another folder") from None
    except OSError as e:
        raise UsageError(f"cannot lock {path} for this run", e.strerror or str(e),
                         "a run holds the folders its sandbox writes") from None


def prepare(runs_dir: str, workspace: str | None, inputs: Sequence[str],
            owner: tuple[int, int] | None) -> RunDir:
    """Create the run directory (and a fresh workspace unless one is given), copy inputs in.

    ``owner`` is the uid/gid that must own what the payload may write (root mode).
    """
    run_id, root = _new_run_root(runs_dir)
    if workspace is None:
        ws = os.path.join(root, "work")
        os.mkdir(ws, 0o700)
        if owner is not None:
            os.chown(ws, *owner)
    else:
        ws = workspace
    if inputs:
        with fsops.Tree(ws, owner) as tree:
            for src in inputs:
                copy_in(tree, src)
    return RunDir(run_id, root, ws, workspace is None)


def record_dir(runs_dir: str, project: str) -> RunDir:
    """A run directory holding only a record: agent mode works in the user's project."""
    run_id, root = _new_run_root(runs_dir)
    return RunDir(run_id, root, project, fresh=False)


def quarantine(root: str | None, runs_dir: str | None = None, project: str = ""
               ) -> Callable[[], str]:
    """A maker, called at most once, of ``RUNS/<run-id>/quarantine`` (the audit's), private
    to the launcher; with no run directory yet (``corral shell``), one is made then."""
    made: list[str] = []

    def make() -> str:
        if not made:
            top = root if root is not None else record_dir(runs_dir or default_runs_dir(),
                                                           project).root
            path = os.path.join(top, "quarantine")
            os.mkdir(path, 0o700)
            made.append(path)
        return made[0]
    return make


def _new_run_root(runs_dir: str) -> tuple[str, str]:
    """A fresh ``RUNS/<run-id>`` directory, private to the launcher."""
    check_path(os.path.abspath(runs_dir), "runs directory")
    run_id = new_run_id()  # (check_runs_dir: api.run's and api.run_agent's start)
    root = os.path.join(runs_dir, run_id)
    try:
        os.makedirs(runs_dir, mode=0o700, exist_ok=True)
        os.mkdir(root, 0o700)
    except OSError as e:
        raise UsageError(f"cannot create a run directory in {runs_dir}", e.strerror or str(e),
                         "pass --runs-dir DIR or set CORRAL_RUNS_DIR to a writable "
                         "directory") from None
    return run_id, root


def copy_in(tree: fsops.Tree, src: str) -> None:
    """Copy ``src`` into the workspace under its own name, replacing what is there.

    Everything is made through :mod:`corral.fsops`, as the workspace's owner when root
    (nothing chowned by path), under a fresh temporary name first, then renamed: a
    symlink left at the destination by an earlier run is replaced, never followed.
    """
    name = os.path.basename(src.rstrip("/"))
    tmp = f".corral-input-{os.urandom(6).hex()}"
    try:
        _copy(src, tree, tmp)
        tree.rename(tmp, tree, name)
    except (OSError, UsageError) as e:
        with small.suppress(OSError):
            remove(tree, tmp)
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"input {src} cannot be copied into the workspace as {name}",
                         e.strerror or str(e), "remove it from the workspace first") from None


def _copy(src: str, tree: fsops.Tree, rel: str) -> None:
    """``src`` (the launcher's own input) to ``rel`` beneath the workspace.  Read by
    descriptor from its top down, no link followed past the path the user gave: a link
    swapped in beneath is copied as a link, never read through (review 7; the folders on
    the way are held by :func:`held`)."""
    parent, name = os.path.split(src.rstrip("/") or "/")
    # Its folder as resolved under held()'s locks (settled), opened from / without
    # following a link: one swapped in since, by a writer no lock keeps out, fails the
    # copy, never leads it elsewhere (review 8).
    try:
        dirfd = fsops.open_no_links(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise UsageError(f"input {src} changed while it was copied", e.strerror or str(e),
                         "copy it again when nothing else writes the folders on its way"
                         ) from None
    try:
        _copy_at(dirfd, name, src, tree, rel)
    finally:
        os.close(dirfd)


def _copy_at(dirfd: int, name: str, src: str, tree: fsops.Tree, rel: str) -> None:
    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        tree.symlink(os.readlink(name, dir_fd=dirfd), rel)
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dirfd)
        try:
            tree.mkdir(rel, 0o755)
            for entry in sorted(os.listdir(fd)):
                _copy_at(fd, entry, os.path.join(src, entry), tree, f"{rel}/{entry}")
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dirfd)
        try:
            if not stat.S_ISREG(os.fstat(source).st_mode):  # swapped since it was looked at
                raise UsageError(f"input {src} changed while it was copied", "",
                                 "copy it again when nothing else writes it")
            fd = tree.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                           stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
            try:
                while chunk := os.read(source, 1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        finally:
            os.close(source)
    else:
        raise UsageError(f"input {src} is not a file, directory or symlink", "",
                         "copy regular files only")


def _type(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return "other"


kind = _type  # the public name: the MCP file tools list entries with the same words


class Walk:
    """Every entry beneath ``root``, as (relative path, lstat, parent dir fd), never
    following a symlink.  The parent descriptor is valid only until the next item.

    Bounded: MAX_ENTRIES entries, MAX_DEPTH levels (two descriptors per level
    are open at a time) and MAX_PATH_BYTES of path names in all, and directories
    are read a chunk at a time, so memory stays small; ``complete`` is
    false when a bound or an unreadable directory cut the walk short.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.complete = True

    def __iter__(self) -> Iterator[tuple[str, os.stat_result, int]]:
        try:
            top = fsops.open_dir(self.root, DIR_FLAGS)
        except OSError:
            self.complete = False
            return
        frames: list[tuple[int, str, Iterator[str]]] = []
        count = path_bytes = 0
        try:
            frames.append((top, "", self._names(top)))
            while frames:
                fd, rel, names = frames[-1]
                name = next(names, None)
                if name is None:
                    os.close(frames.pop()[0])
                    continue
                count += 1
                path = f"{rel}/{name}" if rel else name
                path_bytes += len(path)
                if count > MAX_ENTRIES or path_bytes > MAX_PATH_BYTES:
                    self.complete = False
                    return
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                yield path, st, fd
                if stat.S_ISDIR(st.st_mode):
                    self._enter(frames, fd, name, path)
        finally:
            for fd, _, _ in frames:
                os.close(fd)

    def _enter(self, frames: list[tuple[int, str, Iterator[str]]], parent: int, name: str,
               path: str) -> None:
        if len(frames) >= MAX_DEPTH:
            self.complete = False
            return
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError:
            self.complete = False
            return
        frames.append((sub, path, self._names(sub)))

    def _names(self, fd: int) -> Iterator[str]:
        """A directory's names a chunk at a time, in the directory's order: never the
        whole list (a million names of 250 bytes read at once, and sorted, grew the
        launcher by some 330 MiB, outside the run's limits)."""
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    yield entry.name
        except OSError:
            self.complete = False


def snapshot(root: str) -> dict[str, Stamp]:
    """What is in a workspace before a run, to tell created from modified afterwards."""
    return {path: (_type(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            for path, st, _ in Walk(root)}


@small.contextmanager
def _regular(dir_fd: int, name: str) -> Iterator[tuple[int, os.stat_result] | None]:
    """An entry of an untrusted tree, opened without following a link or blocking on a
    FIFO: (descriptor, fstat) when it is a regular file, None otherwise."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield (fd, st) if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(fd)


def _sha256(dir_fd: int, name: str, budget: list[int]) -> str | None:
    import hashlib  # not at import time: most runs hash nothing

    with _regular(dir_fd, name) as found:
        if found is None or found[1].st_size > budget[0]:
            return None
        digest = hashlib.sha256()
        while chunk := os.read(found[0], 1 << 20):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                return None
            digest.update(chunk)
        return digest.hexdigest()


def collect(root: str, before: dict[str, Stamp]) -> tuple[list[Change], bool]:
    """What the run created, modified or deleted; and whether the list is incomplete
    (cut at MAX_LISTED, or a walk bound reached: see :class:`Walk`).  (Set-id bits are
    the audit's: :mod:`corral.audit`.)
    """
    changes: list[Change] = []
    seen: set[str] = set()
    budget = [MAX_HASHED]
    truncated = False
    listed = 0
    walk = Walk(root)
    for path, st, fd in walk:
        seen.add(path)
        kind = _type(st.st_mode)
        stamp = (kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        old = before.get(path)
        if old == stamp or (old is not None and kind == "dir" and old[0] == "dir"):
            continue
        listed += len(path)
        if len(changes) >= MAX_LISTED or listed > MAX_LISTED_BYTES:
            truncated = True
            continue
        name = os.path.basename(path)
        changes.append(Change(
            path=os.fsdecode(os.fsencode(path)),
            change="created" if old is None else "modified",
            type=kind,
            size=st.st_size if kind == "file" else None,
            sha256=_sha256(fd, name, budget) if kind == "file" else None,
            target=_readlink(fd, name) if kind == "symlink" else None,
        ))
    for path in sorted(set(before) - seen):
        if len(changes) >= MAX_LISTED:
            truncated = True
            break
        changes.append(Change(path, "deleted", before[path][0]))
    changes.sort(key=lambda c: c.path)  # the walk goes in directory order
    return changes, truncated or not walk.complete


def _readlink(dir_fd: int, name: str) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)[:4096]
    except OSError:
        return None


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write the run record atomically: a reader sees the old one or the new one.

    One line of JSON: json's C encoder serves only ``indent=None``, and a record is written
    twice a run (the indented form cost ~0.3 ms each in pure Python); ``corral show`` and
    ``jq`` print it indented."""
    data = (jsonio.dumps(record, sort_keys=True) + "\n").encode()
    tmp = f"{path}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, path)
