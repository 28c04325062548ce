"""How much of the disk a workspace and the run's open files take, where no file system caps it.

No mechanism a plain user can set up caps a directory's size on an ordinary
file system, so the watcher (:mod:`corral.watch`) measures.  One measurement
counts every entry under the workspace once per inode, at least one block
each (so a flood of empty files or directories counts too), plus whatever
on the workspace's file system the run's processes hold after deleting it
(files, directories, symlinks).  Those are found in every thread's descriptor
table (``/proc/PID/task/TID/fd``) and working directory, and in each process's
mappings (``/proc/PID/maps``: a file opened, mapped and closed is held by the
mapping alone; only root may size it): a thread can have a table of its own
(``unshare(CLONE_FILES)``), and a leader that called ``SYS_exit`` shows an
empty ``/proc/PID/fd`` while its other threads hold everything.

What cannot be measured is refused (:class:`Unmeasurable`, which ends the
run): a tree deeper than ``MAX_DEPTH``; a directory that cannot be read even
after the launcher restores its owner's rights; a descriptor table the
launcher may not read (a plain user's payload that made itself non-dumpable:
the kernel then hides it from its own uid); for a plain user, a file held by a
mapping alone.  corral's own processes in the
sandbox (bwrap's PID 1 and corral's init, which is not dumpable on purpose)
are known by their pid inside the sandbox, 1 and 2, and skipped.

Every measurement is bounded: ``MAX_ENTRIES`` names, descriptors and mappings,
``MAX_LINKED`` hard-linked files remembered, ``MAX_SECONDS`` of wall time;
past a bound it is refused too.  Memory stays small whatever the workspace
holds: directories are read in chunks (``scandir``), never listed whole, and
only files with several links are remembered, by inode number.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from .record import Record

__all__ = ["BLOCK", "DiskUse", "Stopped", "Unmeasurable", "descendants", "measure"]

BLOCK = 4096  # every entry costs at least this much
MAX_DEPTH = 200
MAX_ENTRIES = 1_000_000
MAX_LINKED = 262_144
MAX_SECONDS = 60.0
MAX_PROCESSES = 65_536  # processes found by walking the tree (no cgroup to list them)
TICK = 1024  # entries between looks at the clock and the stop flag
# An unreadable table is looked at again after these pauses before it is refused: a task
# is briefly unreadable while it exits (its memory is gone before its files), and a child
# of corral's init until it makes itself dumpable again; on a loaded machine either can
# take a while.  A payload that stays unreadable is refused about two seconds later.
UNREADABLE_RETRIES_S = (0.05, 0.25, 0.7, 1.0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OWN_NS_PIDS = (1, 2)  # bwrap's PID 1 and corral's init, inside the sandbox's PID namespace


class Unmeasurable(Exception):
    """Part of the workspace cannot be measured; treated as over the limit."""


class Stopped(Exception):
    """The measurement was called off: the run is over."""


class DiskUse(Record):
    """One measurement of a workspace."""

    bytes: int = 0
    complete: bool = True  # False when it stopped early, already over ``stop_at``
    entries: int = 0


class _Budget:
    """Counts the work of one measurement and stops it at its bounds or when told to."""

    def __init__(self, stop: threading.Event | None) -> None:
        self.stop = stop
        self.entries = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def tick(self) -> None:
        self.entries += 1
        if self.entries % TICK:
            return
        if self.stop is not None and self.stop.is_set():
            raise Stopped
        if self.entries > MAX_ENTRIES:
            raise Unmeasurable(f"more than {MAX_ENTRIES} entries and open files to look at")
        if time.monotonic() > self.deadline:
            raise Unmeasurable(f"one measurement took more than {MAX_SECONDS:g} s")


class _Counter:
    def __init__(self, use: DiskUse, stop_at: int, budget: _Budget) -> None:
        self.use = use
        self.stop_at = stop_at
        self.budget = budget
        self.linked: set[int] = set()  # inodes with several links, counted once

    def add(self, st: os.stat_result) -> bool:
        """Count ``st`` (once per inode); False once over ``stop_at``."""
        self.budget.tick()
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if st.st_ino in self.linked:
                return True
            if len(self.linked) >= MAX_LINKED:
                raise Unmeasurable(f"more than {MAX_LINKED} files with several hard links")
            self.linked.add(st.st_ino)
        self.use.bytes += max(st.st_blocks * 512, BLOCK)
        if self.use.bytes > self.stop_at:
            self.use.complete = False
            return False
        return True


def _open_dir(name: str, parent: int, restore: bool, parent_ours: bool = True) -> int:
    """Open a directory of the workspace to list it.

    A plain user's payload has the launcher's uid and may chmod a directory it
    owns so that its owner can neither list nor search it.  With ``restore``
    the owner's rights come back, through a handle that cannot be a symlink; the
    parent's search right too (``parent_ours``: the parent is the workspace's), which
    the payload may have taken away after the walk opened it.
    """
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        if not restore or os.fstat(fd).st_mode & stat.S_IRWXU == stat.S_IRWXU:
            return fd
        os.close(fd)
    except PermissionError:
        if not restore:
            raise Unmeasurable(f"cannot read directory {name!r}") from None
        if parent_ours:
            _give_back(parent)
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                         dir_fd=parent)
    except PermissionError:
        raise Unmeasurable(f"cannot read directory {name!r}") from None
    try:
        _give_back(handle)
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        raise Unmeasurable(f"cannot read directory {name!r}") from None
    finally:
        os.close(handle)


def _give_back(fd: int) -> None:
    """The owner's rights on the open directory ``fd``, given back through the descriptor
    (a handle that cannot be a symlink), if the payload took any away."""
    mode = os.stat(fd).st_mode
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(mode) | stat.S_IRWXU)


def _entries(fd: int) -> Iterator[str]:
    """Names in directory ``fd``, read a chunk at a time (never a list of them all)."""
    try:
        with os.scandir(fd) as it:
            for entry in it:
                yield entry.name
    except OSError:
        raise Unmeasurable("cannot list a directory") from None


def _open_top(root: str, restore: bool) -> int:
    """The workspace's top, to list it: through the tree the run holds (corral.fsops), or,
    when it holds none, by name from its parent."""
    from .fsops import open_held

    try:
        held = open_held(root, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        raise Unmeasurable("cannot open the workspace") from None
    if held is None:
        parent = os.open(os.path.dirname(root) or "/", DIR_FLAGS)
        try:
            return _open_dir(os.path.basename(root), parent, restore, parent_ours=False)
        finally:
            os.close(parent)
    try:
        if restore:
            _give_back(held)
        return os.open(".", DIR_FLAGS, dir_fd=held)
    except OSError:
        raise Unmeasurable("cannot read the workspace") from None
    finally:
        os.close(held)


def _walk(root: str, count: _Counter, restore: bool) -> None:
    """Add every entry under ``root``; return early once over the counter's ``stop_at``."""
    top = _open_top(root, restore)
    stack: list[tuple[int, Iterator[str]]] = [(top, _entries(top))]
    try:
        while stack:
            fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            try:
                st = _stat(name, fd, restore)
            except FileNotFoundError:
                continue
            if not count.add(st):
                return
            if stat.S_ISDIR(st.st_mode):
                sub = _enter(name, fd, restore, len(stack))
                if sub is not None:
                    stack.append((sub, _entries(sub)))
    finally:
        for fd, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)


def _stat(name: str, fd: int, restore: bool) -> os.stat_result:
    """``name``'s lstat in the open directory ``fd``.  A directory whose search right the
    payload took away after it was opened (and checked) is given it back once, as
    :func:`_open_dir` does, through the descriptor: that race made a run that never
    exceeded its limit unmeasurable, and so stopped (tests/test_resources.py's control)."""
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except PermissionError:
        if not restore:
            raise
        _give_back(fd)
        return os.stat(name, dir_fd=fd, follow_symlinks=False)


def _enter(name: str, parent: int, restore: bool, depth: int) -> int | None:
    if depth >= MAX_DEPTH:
        raise Unmeasurable(f"directories nested deeper than {MAX_DEPTH}")
    try:
        return _open_dir(name, parent, restore)
    except (FileNotFoundError, NotADirectoryError):
        return None  # renamed or replaced since the stat: the next check sees it
    except OSError as e:
        if e.errno != errno.ELOOP:  # replaced by a symlink, which is not followed
            raise
        return None


@functools.cache
def _own_depth() -> int:
    """How many PID namespaces deep the launcher is (sandboxes are one deeper)."""
    return len(_nspid(os.getpid()) or (0,))


def _nspid(pid: int) -> tuple[int, ...] | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return tuple(int(p) for p in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def corrals_own(pid: int) -> bool:
    """bwrap's PID 1 or corral's init: pid 1 or 2 inside a sandbox's own PID namespace.

    The payload cannot take those numbers: the init holds 2 for the whole run.
    """
    ns = _nspid(pid)
    return ns is not None and len(ns) == _own_depth() + 1 and ns[-1] in OWN_NS_PIDS


def _deleted_open_files(listing: Callable[[], Iterable[int]], dev: int,
                        count: _Counter) -> None:
    """Inodes on ``dev`` that the run's threads hold after unlinking them.

    Any type, not only regular files: a directory keeps every block it ever
    grew to (ext4 never shrinks one), so an emptied one, removed while a
    descriptor or a working directory holds it, took 56 MiB under
    ``--disk 16M`` unseen; a symlink held with ``O_PATH`` keeps its block.

    A file the payload opened, mapped and closed is held by its mapping alone.  Mappings
    are read first and judged last: a file the payload unlinks between the two reads is
    then one its descriptors still hold, seen below, never one taken for held by a
    mapping alone (which, for a plain user, would stop the run as unmeasurable).  What
    the descriptors did not show is judged only if it is still mapped when the
    processes (``listing`` again) are read once more: a process that exited between
    the reads (the kernel unmaps before it closes descriptors) showed its files mapped
    and then no descriptor, and was taken for hiding them (CI).  A mapping reaches no
    process but by ``fork``, and the newcomers' descriptors are read too.
    """
    seen: set[int] = set()
    first = _payload(listing())
    mapped = _mapped_deleted(first, dev, count.budget)
    if not _count_held(first, dev, seen, count):
        return
    left = {ino for ino in mapped if ino not in seen}
    if not left:
        return
    again = _payload(listing())
    now = _mapped_deleted(again, dev, count.budget)
    known = set(first)
    if not _count_held([pid for pid in again if pid not in known], dev, seen, count):
        return
    found = [path for ino, path in now.items() if ino in left and ino not in seen]
    if found and os.geteuid() != 0:
        raise Unmeasurable(f"the run maps {len(found)} deleted file(s) of the workspace "
                           "that no descriptor holds, whose size only root may read")
    _count_deleted(found, dev, seen, count)


def _payload(pids: Iterable[int]) -> list[int]:
    return [pid for pid in pids if not corrals_own(pid)]


def _count_held(pids: list[int], dev: int, seen: set[int], count: _Counter) -> bool:
    """Count the deleted files the threads of ``pids`` hold; False once over the limit."""
    for pid in pids:
        for tid in _threads(pid):
            if not _count_deleted(_held_paths(pid, tid), dev, seen, count):
                return False
    return True


def _threads(pid: int) -> list[str]:
    """The thread ids of process ``pid``; none once it is gone."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _count_deleted(paths: Iterable[str], dev: int, seen: set[int], count: _Counter) -> bool:
    """Count what ``paths`` lead to that is deleted on ``dev``; False once over the limit."""
    for path in paths:
        count.budget.tick()
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_nlink == 0 and st.st_dev == dev and st.st_ino not in seen:
            seen.add(st.st_ino)
            if not count.add(st):
                return False
    return True


def _mapped_deleted(pids: list[int], dev: int, budget: _Budget) -> dict[int, str]:
    """{inode: ``/proc/TID/map_files`` path} of the files on ``dev`` that the processes
    ``pids`` map and that were deleted.

    Read through a thread: the threads of a process share one memory map, but a leader
    that called ``SYS_exit`` while another thread runs has none any more, so
    ``/proc/PID/maps`` read empty and 70 MiB in mapped-only files went unseen under
    ``--disk 16M`` (review 12); its ``map_files`` are gone with it, a live thread's are
    not."""
    found: dict[int, str] = {}
    for pid in pids:
        for tid in _threads(pid):
            if _thread_maps(pid, tid, dev, budget, found):
                break  # one live thread shows the map all of them share
    return found


def _thread_maps(pid: int, tid: str, dev: int, budget: _Budget,
                 found: dict[int, str]) -> bool:
    """Add thread ``tid``'s deleted mapped files on ``dev`` to ``found``; False if it
    showed no map (an exited thread's is empty)."""
    lines = 0
    try:
        with open(f"/proc/{pid}/task/{tid}/maps", "rb") as f:
            for line in f:
                budget.tick()
                lines += 1
                if not line.endswith(b" (deleted)\n"):
                    continue
                fields = line.split(None, 5)
                major, _, minor = fields[3].partition(b":")
                if (int(major, 16), int(minor, 16)) == (os.major(dev), os.minor(dev)):
                    # maps pads an address to 8 digits; map_files names take none (a file
                    # mapped below 0x10000000 had a name root could not stat: 70 MiB
                    # held unseen, review 13)
                    start, _, end = fields[0].partition(b"-")
                    found.setdefault(int(fields[4]), f"/proc/{tid}/map_files/"
                                     f"{int(start, 16):x}-{int(end, 16):x}")
    except (OSError, ValueError, IndexError):
        return False  # gone; or unreadable, which its descriptor tables were refused for
    return lines > 0


def _held_paths(pid: int, tid: str) -> list[str]:
    """What one thread holds: its descriptors and its working directory (a thread may
    have one of its own, ``unshare(CLONE_FS)``)."""
    return [*_fd_paths(pid, tid), f"/proc/{pid}/task/{tid}/cwd"]


def _fd_paths(pid: int, tid: str) -> list[str]:
    """The descriptors of one thread, as /proc paths to stat.

    The kernel hides a thread's table from its own uid when the process is not
    dumpable, and shows a thread that has exited (a leader that called
    ``SYS_exit`` stays, a zombie, while its other threads run) as root's: that
    one holds nothing any more.  A table still unreadable after
    ``UNREADABLE_RETRIES_S`` is refused.
    """
    fd_dir = f"/proc/{pid}/task/{tid}/fd"
    for pause in (*UNREADABLE_RETRIES_S, None):
        try:
            return [f"{fd_dir}/{fd}" for fd in os.listdir(fd_dir)]
        except PermissionError:
            if corrals_own(pid) or _exited(pid, tid):
                return []
            if pause is None:
                break
            time.sleep(pause)
        except OSError:
            return []  # the thread or process is gone
    raise Unmeasurable(f"the open files of process {pid} cannot be read (it is not "
                       "dumpable)")


def _exited(pid: int, tid: str) -> bool:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from each thread's ``children`` list: every
    process of a PID namespace descends from its PID 1.  A process that forks and exits
    while this walks can be missed; the cgroup's own list (where there is one) cannot."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < MAX_PROCESSES:
        p = todo.pop()
        found.append(p)
        for tid in _threads(p):
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return found


def measure(root: str, *, pids: Iterable[int] | Callable[[], Iterable[int]] = (),
            stop_at: int = 1 << 62, restore: bool = False,
            stop: threading.Event | None = None) -> DiskUse:
    """How much of the disk ``root`` and the files ``pids`` hold open take up (``pids``
    may be a function that lists them, called again when a mapping needs a second look).

    Raises :class:`Unmeasurable` when part of it cannot be measured, and
    :class:`Stopped` when ``stop`` is set meanwhile.
    """
    use = DiskUse()
    budget = _Budget(stop)
    count = _Counter(use, stop_at, budget)
    _walk(root, count, restore)
    if use.complete:
        fixed = () if callable(pids) else tuple(pids)
        listing = pids if callable(pids) else (lambda: fixed)
        _deleted_open_files(listing, os.stat(root).st_dev, count)
    use.entries = budget.entries
    return use
