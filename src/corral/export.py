"""Copying a run's workspace out of its image: an untrusted tree, read by descriptor.

The source is the run's own file system (:mod:`corral.diskimage`), seen only
through the launcher's descriptor of its root, after every process of the run
is gone; it is read with the launcher's rights (a file the payload made
unreadable is still copied).  Every source entry is opened beneath its
parent's descriptor (:func:`corral.fsops.open_beneath`: never through a link,
``O_NONBLOCK``, so a FIFO never blocks us) and type-checked after opening.
The destination is a fresh directory under the launcher's private run
directory, written through descriptors as the payload's owner
(:func:`corral.fsops.acting_as`): everything there is theirs from birth.
What is copied:

* directories, regular files (only their data extents: a file with a huge
  hole or an unwritten ``fallocate`` range stays sparse, so the copy never
  takes more of the host's disk than the image held), symlinks (the target
  string, never followed) and FIFOs;
* hard links as hard links (copying each name would multiply the data): the
  first copy of each such file gets a second name, its inode number, in a
  staging directory of the destination's, and every later name is linked from
  there (the last one takes the staging name, so no file ever has more names
  than in the image).  Nothing is remembered in memory, and no link goes
  through a path of the tree, which may be longer than ``PATH_MAX`` or pass
  through a directory its owner may not enter;
* permission bits without set-user-ID and set-group-ID, and modification times.

Sockets and devices are skipped (the image is mounted ``nodev``).  Bounded by
``MAX_ENTRIES`` names, ``MAX_DEPTH`` levels and the image's own size in
bytes; past a bound, or when the host refuses a write, the export stops and
says so, and the caller keeps the image.
"""

from __future__ import annotations

import os
import stat

from . import small
from .fsops import acting_as, open_beneath
from .record import NamedTuple

__all__ = ["Exported", "export"]

MAX_ENTRIES = 1_000_000
MAX_DEPTH = 128  # three frames and three descriptors per level
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
STAGING = ".corral-export-links-"  # a random suffix follows: no name of the tree's


class Exported(NamedTuple):
    entries: int
    bytes: int  # data copied
    skipped: int  # sockets and devices
    complete: bool
    why: str = ""  # why not complete


class _Stop(Exception):
    pass


class _Export:
    def __init__(self, owner: tuple[int, int], max_bytes: int, staging: int) -> None:
        self.owner = owner
        self.max_bytes = max_bytes
        self.staging = staging  # first copies of hard-linked files, named by source inode
        self.entries = self.bytes = self.skipped = 0

    def tree(self, src: int, dst: int, rel: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Stop(f"directories nested deeper than {MAX_DEPTH}")
        with os.scandir(src) as entries:
            for entry in entries:
                self.entries += 1
                if self.entries > MAX_ENTRIES:
                    raise _Stop(f"more than {MAX_ENTRIES} entries")
                self.entry(src, dst, entry.name, f"{rel}/{entry.name}" if rel else entry.name,
                           depth)

    def entry(self, src: int, dst: int, name: str, rel: str, depth: int) -> None:
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            self.directory(src, dst, name, rel, depth, st)
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1 and self.linked(st, dst, name):
                return
            self.file(src, dst, name, st)
            if st.st_nlink > 1:
                with acting_as(self.owner):
                    os.link(name, str(st.st_ino), src_dir_fd=dst, dst_dir_fd=self.staging,
                            follow_symlinks=False)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=src)
            with acting_as(self.owner):
                os.symlink(target, name, dir_fd=dst)
        elif stat.S_ISFIFO(st.st_mode):
            with acting_as(self.owner):
                os.mkfifo(name, stat.S_IMODE(st.st_mode) & 0o777, dir_fd=dst)
        else:
            self.skipped += 1

    def linked(self, st: os.stat_result, dst: int, name: str) -> bool:
        """A later name of a file already copied: made a link to that copy."""
        key = str(st.st_ino)
        with acting_as(self.owner):
            try:
                names = os.stat(key, dir_fd=self.staging, follow_symlinks=False).st_nlink
            except FileNotFoundError:
                return False  # the first name met
            if names >= st.st_nlink:  # the last one: the staging name moves into place
                os.rename(key, name, src_dir_fd=self.staging, dst_dir_fd=dst)
            else:
                os.link(key, name, src_dir_fd=self.staging, dst_dir_fd=dst,
                        follow_symlinks=False)
        return True

    def directory(self, src: int, dst: int, name: str, rel: str, depth: int,
                  st: os.stat_result) -> None:
        with acting_as(self.owner):
            os.mkdir(name, 0o700, dir_fd=dst)
            sub_dst = os.open(name, DIR_FLAGS, dir_fd=dst)
        try:
            sub_src = open_beneath(src, name, DIR_FLAGS)
            try:
                if os.fstat(sub_src).st_ino != st.st_ino:
                    raise _Stop(f"{rel} changed during the copy")
                self.tree(sub_src, sub_dst, rel, depth + 1)
                self.finish(sub_dst, st, stat.S_IMODE(st.st_mode) & 0o1777)
            finally:
                os.close(sub_src)
        finally:
            os.close(sub_dst)

    def file(self, src: int, dst: int, name: str, st: os.stat_result) -> None:
        fd = open_beneath(src, name, FILE_FLAGS)
        try:
            got = os.fstat(fd)
            if not stat.S_ISREG(got.st_mode) or got.st_ino != st.st_ino:
                raise _Stop(f"{name!r} changed during the copy")
            with acting_as(self.owner):
                out = os.open(name, NEW_FILE, 0o600, dir_fd=dst)
            try:
                self.data(fd, out, got.st_size)
                self.finish(out, got, stat.S_IMODE(got.st_mode) & 0o777)
            finally:
                os.close(out)
        finally:
            os.close(fd)

    def data(self, src: int, out: int, size: int) -> None:
        """Copy the data extents only; holes stay holes."""
        pos = 0
        while pos < size:
            try:
                start = os.lseek(src, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but a hole from here on
                break
            end = os.lseek(src, start, os.SEEK_HOLE)
            self.bytes += end - start
            if self.bytes > self.max_bytes:
                raise _Stop(f"more data than the image holds ({self.max_bytes} bytes)")
            os.lseek(out, start, os.SEEK_SET)
            while start < end:
                sent = os.sendfile(out, src, start, min(CHUNK, end - start))
                if sent == 0:
                    break  # the source shrank meanwhile: nothing more to copy
                start += sent
            pos = end
        os.ftruncate(out, size)

    def finish(self, fd: int, st: os.stat_result, mode: int) -> None:
        with acting_as(self.owner):
            os.fchmod(fd, mode)
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def export(src_root: int, dest: str, owner: tuple[int, int], max_bytes: int) -> Exported:
    """Copy the tree under directory descriptor ``src_root`` into ``dest`` (an existing,
    empty, trusted directory).  Never raises for what it finds: it stops and says why."""
    dest_fd = os.open(dest, DIR_FLAGS)
    # os.urandom(8).hex() is what secrets.token_hex(8) returns; importing secrets would
    # load hmac, hashlib and OpenSSL (~2.5-8 ms) at every start of `corral run`.
    staging = STAGING + os.urandom(8).hex()
    job: _Export | None = None
    why = ""
    try:
        with acting_as(owner):
            os.mkdir(staging, 0o700, dir_fd=dest_fd)
            staging_fd = os.open(staging, DIR_FLAGS, dir_fd=dest_fd)
        try:
            job = _Export(owner, max_bytes, staging_fd)
            job.tree(src_root, dest_fd, "", 0)
        finally:
            _remove_staging(dest_fd, staging, staging_fd, owner)
    except _Stop as e:
        why = str(e)
    except OSError as e:
        why = f"{e.filename or ''} {e.strerror or e}".strip()
    finally:
        with small.suppress(OSError):
            os.close(dest_fd)
    if job is None:
        return Exported(0, 0, 0, False, why)
    return Exported(job.entries, job.bytes, job.skipped, not why, why)


def _remove_staging(dest_fd: int, staging: str, staging_fd: int,
                    owner: tuple[int, int]) -> None:
    """The staging directory's names are second names of copies in the tree: removing
    them removes no file."""
    try:
        with acting_as(owner):
            with os.scandir(staging_fd) as names:
                for entry in names:
                    os.unlink(entry.name, dir_fd=staging_fd)
            os.rmdir(staging, dir_fd=dest_fd)
    finally:
        os.close(staging_fd)
