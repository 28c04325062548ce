"""The live watch: while a run lives, a ``commondir`` or ``config.worktree`` that appears
in a main git directory is removed at once.

A mount cannot cover what does not exist yet, and git on the host (a shell prompt, an
editor polling ``git status``) reads these two as they appear: ``commondir`` would send it
to another config and hooks, ``config.worktree`` would add keys (``core.fsmonitor``) to
the config.  One inotify instance watches every main git directory (``IN_CREATE`` and
``IN_MOVED_TO``, since git writes through a lock file and a rename); a thread removes what
appears through :mod:`corral.fsops`, as the tree's owner.  The window between the
creation and the removal is the scheduling delay of that thread: measured in
docs/threat-model.md.  What the watch removed is reported like the audit's actions.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import threading
from collections.abc import Sequence
from types import TracebackType

from . import fsops
from .audit import Action
from .errors import HostError, start_thread
from .fswalk import remove

__all__ = ["LiveWatch"]

IN_CREATE, IN_MOVED_TO, IN_ONLYDIR, IN_Q_OVERFLOW = 0x100, 0x80, 0x01000000, 0x4000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
WATCHED = ("commondir", "config.worktree")
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name


def _unwatchable(what: str, err: int, knob: str) -> HostError:
    """Fail closed: without the watch, host git would obey a plant until the run ends."""
    hint = f"raise {knob} (sysctl)" if err in (errno.ENOSPC, errno.EMFILE) else "check inotify"
    return HostError(f"corral cannot watch {what} during the run ({os.strerror(err)})",
                     "a commondir or config.worktree planted there would be obeyed by git on "
                     "the host until the run ends", hint)


class LiveWatch:
    """A context manager: watches ``gitdirs`` (each (path, top, owner)) while it is open."""

    def __init__(self, gitdirs: Sequence[tuple[str, str, tuple[int, int] | None]]) -> None:
        self.gitdirs = list(gitdirs)
        self.actions: list[Action] = []
        self.present: set[str] = set()  # there at launch (read-only inside): never removed
        self.fd = -1
        self.wds: dict[int, tuple[str, str, tuple[int, int] | None]] = {}
        self.stop_r = self.stop_w = -1
        self.thread: threading.Thread | None = None

    def __enter__(self) -> LiveWatch:
        if not self.gitdirs:
            return self
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise _unwatchable("the run's git directories", ctypes.get_errno(),
                               "fs.inotify.max_user_instances")
        for path, top, owner in self.gitdirs:
            self._add(libc, path, top, owner)
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC)
        self.thread = start_thread(self._serve, "corral-livewatch")
        return self

    def _add(self, libc: ctypes.CDLL, path: str, top: str, owner: tuple[int, int] | None
             ) -> None:
        """Watch the git directory itself, reached by descriptor (never through a link)."""
        try:
            with fsops.Tree(top, owner) as tree:
                rel = os.path.relpath(path, top)
                handle = tree.open(rel, os.O_PATH | os.O_DIRECTORY)
                self.present |= {os.path.join(path, n) for n in WATCHED
                                 if tree.lstat(f"{rel}/{n}") is not None}
        except OSError as e:  # gone or replaced since the launch scan: nothing starts
            raise HostError(f"cannot watch the git directory {path}", e.strerror or str(e),
                            "it changed since the launch looked at it; start again") from None
        try:
            wd = libc.inotify_add_watch(self.fd, f"/proc/self/fd/{handle}".encode(),
                                        IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)
        finally:
            os.close(handle)
        if wd < 0:
            raise _unwatchable(path, ctypes.get_errno(), "fs.inotify.max_user_watches")
        self.wds[wd] = (path, top, owner)

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd, self.stop_r], [], [])
            stopping = self.stop_r in ready
            # Stopping, what is queued still counts: the sandbox has ended, so every event
            # of its writes is in the queue, and an exit that came quickly must not leave
            # them to the audit (seen in CI: a commondir quarantined, not removed at once).
            while self.fd in ready or stopping:
                try:
                    data = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    break
                self._events(data)
                if not stopping:
                    break
            if stopping:
                return

    def _events(self, data: bytes) -> None:
        offset = 0
        while offset + EVENT.size <= len(data):
            wd, mask, _, size = EVENT.unpack_from(data, offset)
            name = data[offset + EVENT.size:offset + EVENT.size + size].rstrip(b"\0")
            offset += EVENT.size + size
            if mask & IN_Q_OVERFLOW:
                self._sweep()
            elif wd in self.wds and os.fsdecode(name) in WATCHED:
                self._remove(*self.wds[wd], os.fsdecode(name))

    def _sweep(self) -> None:
        """Events were lost: look at every watched directory."""
        for path, top, owner in self.wds.values():
            for name in WATCHED:
                self._remove(path, top, owner, name)

    def _remove(self, path: str, top: str, owner: tuple[int, int] | None, name: str) -> None:
        target = os.path.join(path, name)
        if target in self.present:
            return
        try:
            with fsops.Tree(top, owner) as tree:
                rel = os.path.relpath(target, top)
                if tree.lstat(rel) is None:
                    return
                remove(tree, rel)
        except Exception as e:  # never the watch's end: it must go on for the next one
            why = e.strerror if isinstance(e, OSError) else type(e).__name__
            self.actions.append(Action(target, "failed", f"appeared during the run and could "
                                       f"not be removed at once ({why})"))
            return
        self.actions.append(Action(target, "removed", "appeared during the run: git on the "
                                   "host would have obeyed it"))

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.thread is not None:
            os.write(self.stop_w, b"x")
            self.thread.join()
        for fd in (self.fd, self.stop_r, self.stop_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
