"""A workspace whose file system caps it: one ext4 image per run, for runs started by root.

The disk limit holds by construction: whatever the payload does (``fallocate``,
files deleted while open, hard links by the million, empty files), it cannot
take more of the host's disk than the image's size, because everything it
writes lands in the image.  Lifecycle, owned by :mod:`corral.enforce`:

1. :meth:`Image.create`: a sparse file ``RUNS/<run-id>/work.img`` (the run
   directory is the launcher's own, mode 0700), formatted by copying the few
   blocks of a template (:func:`template`: ``mke2fs`` run once per size and owner
   in root's cache, argv from :func:`corral.limits.mke2fs_argv`; about
   0.1 ms a run against 4 ms for ``mke2fs`` itself), a loop device that detaches itself,
   and a *detached* mount of it (:func:`corral.mountns.mount_fs`): on the host
   it exists only as the launcher's descriptor.  Inputs are copied in through
   that descriptor.
2. The run: bwrap's child moves the mount over ``RUNS/<run-id>/work`` in a
   private mount namespace (:class:`corral.mountns.ChildMounts`), and bwrap
   binds it at ``/work`` as it would the plain directory.
3. While it runs, :meth:`used` (``statvfs``, exact and constant-time) tells the
   watcher how much the run added.
4. After the run, on every exit path: :meth:`export` copies the tree out into
   ``RUNS/<run-id>/work`` (:mod:`corral.export`); :meth:`close` lets go of the
   mount (the kernel then unmounts it and frees the loop device) and deletes
   the image only when the export was complete: an export that stopped at a
   bound, or was cut short by anything at all (a signal's exception), keeps
   the image, and the record says so.  Before the run (its inputs could not be
   copied in), :meth:`discard` deletes it.

If corral itself is killed (SIGKILL), the kernel still unmounts and frees
everything; only the image file remains in the run directory.
"""

from __future__ import annotations

import errno
import os
import stat

from . import limits, mountns, small
from .export import Exported, export

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Image", "template", "templates_dir", "unavailable"]

# Formatted templates (see template()) are a cache the launcher remakes whenever one is
# missing: root's, in /var/cache/corral/images, or CORRAL_CACHE_DIR/images.  Never in a
# runs directory, which holds runs alone.
CACHE_DIR = "/var/cache/corral"

MKE2FS_TIMEOUT_S = 60.0
TEMPLATE_SLACK = 1 << 20  # data a template may report beyond its blocks (tails, rounding)
# Templates kept: one is made per size (the disk limit plus the inputs), so a stream of
# runs of other sizes (corral serve's requests) must not fill the disk with them (found
# by review).  A new one evicts the oldest.
TEMPLATES_KEPT = 8


def _mke2fs() -> str | None:
    return next((p for p in limits.MKE2FS if os.access(p, os.X_OK)), None)


@small.cache
def unavailable(is_root: bool) -> str | None:
    """Why a run's workspace cannot have an image here, or None when it can."""
    if not is_root:
        return "only root may mount a file system image"
    if not os.path.exists("/dev/loop-control"):
        return "this host has no loop devices (/dev/loop-control)"
    if _mke2fs() is None:
        return "mke2fs is not installed (e2fsprogs)"
    try:
        os.close(mountns.fs_context("ext4"))
    except OSError as e:
        return f"this kernel cannot make detached mounts (fsopen: {e.strerror})"
    return None


def _format(fd: int, owner: tuple[int, int]) -> None:
    """mke2fs on the open (sized, sparse) file ``fd``."""
    import subprocess  # once per size and owner (a template is kept): not every run's

    mke2fs = _mke2fs()
    assert mke2fs is not None  # checked by unavailable()
    try:
        subprocess.run(limits.mke2fs_argv(mke2fs, f"/proc/self/fd/{fd}", owner), env={},
                       stdin=subprocess.DEVNULL, capture_output=True, check=True,
                       timeout=MKE2FS_TIMEOUT_S, pass_fds=[fd])
    except subprocess.SubprocessError as e:  # as OSError, the one error callers catch
        said = (getattr(e, "stderr", None) or b"").decode(errors="replace").strip()
        raise OSError(f"{e}{': ' + said.splitlines()[-1] if said else ''}") from None


def templates_dir() -> str:
    return os.path.join(os.environ.get("CORRAL_CACHE_DIR") or CACHE_DIR, "images")


def template(folder: str, size: int, owner: tuple[int, int]) -> int | None:
    """A descriptor of a formatted image of ``size`` bytes for ``owner``, made once in
    ``folder`` (the launcher's own: mode 0700, its owner's), or None when ``folder`` or the
    template there is not as corral made it (then every run formats its own).

    Its name holds what shaped it (size, owner, mke2fs's argv and binary), so a change to
    any of them makes a new one.  A template is never mounted, only copied; it is made
    unnamed and linked into place whole, so no run ever copies a half-made one.
    """
    mke2fs = _mke2fs()
    assert mke2fs is not None
    st = os.stat(mke2fs)
    shape = "\0".join([*limits.mke2fs_argv(mke2fs, "", owner), str(st.st_ino),
                       str(st.st_size), str(st.st_mtime_ns)])
    from .seccache import sha256  # loaded by every run already: no zlib for one checksum

    digest = sha256(shape.encode()).hexdigest()[:8]
    name = f"ext4-{size}-{owner[0]}-{owner[1]}-{digest}.img"
    with small.suppress(FileExistsError):
        os.makedirs(folder, 0o700)
    dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not _private(os.fstat(dirfd), stat.S_ISDIR):
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dirfd)
        except FileNotFoundError:
            fd = _make_template(dirfd, name, size, owner)
        st = os.fstat(fd)
        if _private(st, stat.S_ISREG) and st.st_size == size and st.st_nlink <= 1:
            return fd
        os.close(fd)
        return None
    finally:
        os.close(dirfd)


def _private(st: os.stat_result, kind: Callable[[int], bool]) -> bool:
    return kind(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def _make_template(dirfd: int, name: str, size: int, owner: tuple[int, int]) -> int:
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    try:
        os.ftruncate(fd, size)
        _format(fd, owner)
        with small.suppress(FileExistsError):  # another launcher's, made alike
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dirfd, follow_symlinks=True)
    except BaseException:
        os.close(fd)
        raise
    _evict(dirfd, keep=name)
    return fd


def _evict(dirfd: int, keep: str) -> None:
    """The oldest templates beyond TEMPLATES_KEPT go (``keep``, just made, stays)."""
    found = []
    for entry in os.listdir(dirfd):
        if entry.startswith("ext4-") and entry.endswith(".img") and entry != keep:
            with small.suppress(OSError):
                st = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
                found.append((st.st_mtime_ns, entry))
    for _, entry in sorted(found)[:max(0, len(found) + 1 - TEMPLATES_KEPT)]:
        with small.suppress(OSError):
            os.unlink(entry, dir_fd=dirfd)


def _usable_template(folder: str, size: int, owner: tuple[int, int]) -> int | None:
    """A descriptor of the template (see template()), or None when there is none usable
    here (the caller formats the image itself)."""
    try:
        return template(folder, size, owner)
    except OSError:
        return None


def _copy_blocks(src: int, dest: int) -> bool:
    """Copy the blocks the template ``src`` holds into ``dest`` (a loop device of the same
    size, over a sparse file); False when that cannot be done (the caller formats it)."""
    try:
        extents = _extents(src)
        # A file system that cannot tell holes reports the whole file as data: copying
        # it would write gigabytes of zeros, where mke2fs writes a few blocks.
        if extents is None or sum(n for _, n in extents) > \
                os.fstat(src).st_blocks * 512 + TEMPLATE_SLACK:
            return False
        for offset, length in extents:
            while length > 0:
                data = os.pread(src, min(length, 1 << 20), offset)
                n = os.pwrite(dest, data, offset) if data else 0
                if n <= 0:
                    return False
                offset, length = offset + n, length - n
        return True
    except OSError:
        return False


def _extents(fd: int) -> list[tuple[int, int]] | None:
    """(offset, length) of each run of data in ``fd``, holes left out."""
    out: list[tuple[int, int]] = []
    offset = 0
    while True:
        try:
            offset = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as e:
            return out if e.errno == errno.ENXIO else None  # ENXIO: no data after offset
        end = os.lseek(fd, offset, os.SEEK_HOLE)
        out.append((offset, end - offset))
        offset = end


class Image:
    """One run's workspace file system: :meth:`create`, then always :meth:`close`."""

    def __init__(self, path: str, capacity: int, owner: tuple[int, int],
                 templates: str | None = None) -> None:
        self.path = path
        self.capacity = capacity  # free bytes the run starts with, at least
        self.size = limits.image_size(capacity)
        self.owner = owner
        self.templates = templates  # the folder of formatted templates (see template())
        self.mount_fd: int | None = None
        self.exported: Exported | None = None

    def create(self) -> None:
        """Raises OSError (or SubprocessError) when the host will not make it.

        What reaches the host's disk is kept to what the payload leaves there long enough
        for the host to write it back: the template's blocks are written through the loop
        device once it is bound, not into the file before (binding fsyncs the file, which
        wrote them out at every run), and the mount takes no barriers (``nobarrier``: its
        unmount would otherwise fsync everything the run wrote into the file just before
        the file is deleted, and the host disk then discard it).  An image lives only as
        long as its run, which a crash of the host ends anyway.  Measured in
        bench/RESULTS.md (the disk image phases of "The launch floor").
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        src = None
        try:
            os.ftruncate(fd, self.size)  # sparse: the host's disk holds only what is written
            if self.templates is not None:
                src = _usable_template(self.templates, self.size, self.owner)
            if src is None:
                _format(fd, self.owner)
            device, dev = mountns.attach_loop(self.path)
        except BaseException:
            if src is not None:
                os.close(src)
            raise
        finally:
            os.close(fd)
        try:
            if src is not None and not _copy_blocks(src, dev):
                _format(dev, self.owner)  # mke2fs -F writes over what was copied
            # noinit_itable: the kernel would otherwise zero the inode tables mke2fs left
            # for later, in the background, writing them out into the sparse image.
            self.mount_fd = mountns.mount_fs("ext4", device, ("noinit_itable", "nobarrier"))
        finally:
            os.close(dev)  # the mount holds the device now; autoclear frees it after
            if src is not None:
                os.close(src)
        os.rmdir("lost+found", dir_fd=self.mount_fd)  # root's; nothing of the run's

    def root(self) -> int:
        """A readable descriptor of the image's root directory (the caller closes it)."""
        assert self.mount_fd is not None
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.mount_fd)

    def used(self) -> tuple[int, int, bool]:
        """(bytes in use, inodes in use, full): exact, whatever the payload did."""
        assert self.mount_fd is not None
        st = os.statvfs(f"/proc/self/fd/{self.mount_fd}")
        full = st.f_bavail == 0 or st.f_favail == 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree, full

    def export(self, dest: str) -> Exported:
        """Copy the whole tree into ``dest`` (empty, the launcher's own)."""
        root = self.root()
        try:
            self.exported = export(root, dest, self.owner, self.size)
        except BaseException as e:  # cut short: the files are still only in the image
            self.exported = Exported(0, 0, 0, False, f"interrupted ({type(e).__name__})")
            raise
        finally:
            os.close(root)
        return self.exported

    def close(self) -> None:
        """Let go of the mount, and delete the image once all of it is copied out.

        The name goes first: the loop device keeps the file until the kernel has
        unmounted it, and if corral dies in between nothing is left behind.
        """
        self._release(self.exported is not None and self.exported.complete)

    def discard(self) -> None:
        """Before the run: the image holds copies of its inputs only; delete it."""
        self._release(True)

    def _release(self, delete: bool) -> None:
        if delete:
            with small.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self.mount_fd is not None:
            os.close(self.mount_fd)
            self.mount_fd = None

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"disk_enforcement": "file system", "image_bytes": self.size,
                                  "image_capacity_bytes": self.capacity}
        if self.exported is not None:
            out["exported_entries"] = self.exported.entries
            if not self.exported.complete:
                out["export_incomplete"] = self.exported.why
                out["image"] = self.path  # mount -o loop,ro IMAGE DIR to read the rest
        return out
