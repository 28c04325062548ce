"""Building bwrap's argument list: pure, ordered, tested with exact lists.

A :class:`Sandbox` is a fully resolved description of one sandbox (every
path checked, every uid known).  :func:`build_ops` turns it into a list of
small operation objects, each of which knows its bwrap flag; :func:`render`
turns those into words, asking an :class:`FdTable` for the descriptor
numbers of data and path handles.  Nothing here touches the machine.

bwrap applies operations in order, and a later mount covers an earlier one,
so :func:`build_ops` emits them in this documented order:

 1. process and namespace flags
 2. the filesystem, ``Sandbox.mounts``, itself ordered by the function that
    built it: :func:`run_mounts` for ``corral run``, ``agent.agent_mounts``
    for ``corral agent`` and ``corral shell``
 3. corral's init (and ``Sandbox.files``, such as the egress bridge), read-only
    under ``/run/corral``, then ``Sandbox.seal``
    (remounts that must follow every mount point, the init's included)
 4. environment (``--clearenv``: the init starts with none, see :func:`init_environment`),
    working directory, seccomp, status

:func:`run_mounts` orders the run-mode filesystem as: ``/usr`` and its
usr-merge symlinks; ``/proc``, ``/dev`` (its ``/dev/pts`` bounded or empty),
sized ``/tmp`` and ``/dev/shm``;
``/etc`` files (small ones copied, the rest bound read-only), interpreter prefixes
and user paths; the workspace, writable and bound by descriptor; generated files
such as ``/etc/passwd``.  Its seal is :data:`ROOT_SEAL`: bwrap's root tmpfs, with the
copies on it, read-only once everything is in place.
Nothing is ever placed under the workspace (DESIGN fact 7).
"""

from __future__ import annotations

import os

from .record import NamedTuple, Record, field

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from typing import Any, Protocol

    class FdTable(Protocol):
        def fd(self, item: Data | PathHandle | HostFile) -> int: ...

__all__ = [
    "CINIT_PATH",
    "DEV_SEAL",
    "INIT_PATH",
    "ROOT_SEAL",
    "Data",
    "FdTable",
    "HostFile",
    "Mount",
    "Op",
    "PathHandle",
    "Sandbox",
    "build_ops",
    "init_config",
    "init_environment",
    "render",
    "render_lines",
    "run_mounts",
]

INIT_PATH = "/run/corral/init.py"
CINIT_PATH = "/run/corral/init"  # the compiled init (corral.cinit), when a run has it


class Data(NamedTuple):
    """Bytes handed to bwrap through a descriptor (a generated file, a seccomp program)."""

    name: str  # for --dry-run and error messages
    content: bytes


class PathHandle(NamedTuple):
    """A host path that the launcher opens with O_PATH and hands to bwrap as a descriptor.

    Writable trees are bound this way: the launcher checks and opens the
    exact directory, so a path component swapped afterwards changes nothing.
    ``no_links``: every component is reached without following a link (paths inside
    writable trees, where another sandbox could swap one in at any moment).
    """

    path: str
    directory: bool = True
    no_links: bool = False


class HostFile(NamedTuple):
    """A small root-owned host file (``/etc/services``) that bwrap copies in with ``--file``.

    The launcher opens it for reading (corral.fsops.open_host_file checks it again); a
    copy into the read-only /etc tmpfs costs bwrap no mount, where a bind costs it a mount,
    a re-read of /proc/self/mountinfo and a remount.
    """

    path: str


# One tiny type per bwrap operation; each yields its own words.  Named tuples rather than
# dataclasses: immutable and hashable all the same, and ten times cheaper to define, which
# matters at every CLI start.
class Flag(NamedTuple):
    words: tuple[str, ...]

    def args(self, fds: FdTable) -> list[str]:
        return list(self.words)


class RoBind(NamedTuple):
    source: str
    dest: str
    optional: bool = False

    def args(self, fds: FdTable) -> list[str]:
        return ["--ro-bind-try" if self.optional else "--ro-bind", self.source, self.dest]


class BindFd(NamedTuple):
    handle: PathHandle
    dest: str
    writable: bool

    def args(self, fds: FdTable) -> list[str]:
        flag = "--bind-fd" if self.writable else "--ro-bind-fd"
        return [flag, str(fds.fd(self.handle)), self.dest]


class DevBind(NamedTuple):
    """A host path bound with its device nodes usable (a devpts instance)."""

    source: str
    dest: str

    def args(self, fds: FdTable) -> list[str]:
        return ["--dev-bind", self.source, self.dest]


class Symlink(NamedTuple):
    target: str
    dest: str

    def args(self, fds: FdTable) -> list[str]:
        return ["--symlink", self.target, self.dest]


class Dir(NamedTuple):
    dest: str
    perms: int = 0o755

    def args(self, fds: FdTable) -> list[str]:
        return ["--perms", f"{self.perms:04o}", "--dir", self.dest]


class Tmpfs(NamedTuple):
    dest: str
    size: int | None = None
    perms: int = 0o755

    def args(self, fds: FdTable) -> list[str]:
        size = ["--size", str(self.size)] if self.size else []
        return [*size, "--perms", f"{self.perms:04o}", "--tmpfs", self.dest]


class Kernel(NamedTuple):
    """--proc or --dev."""

    flag: str
    dest: str

    def args(self, fds: FdTable) -> list[str]:
        return [self.flag, self.dest]


class RoData(NamedTuple):
    data: Data
    dest: str
    perms: int = 0o444

    def args(self, fds: FdTable) -> list[str]:
        return ["--perms", f"{self.perms:04o}", "--ro-bind-data", str(fds.fd(self.data)),
                self.dest]


class CopyFile(NamedTuple):
    """A file written by bwrap onto its root tmpfs (``--file``): no mount of its own.

    Only in a sandbox whose seal ends with ROOT_SEAL (build_ops refuses it otherwise)."""

    source: Data | HostFile
    dest: str
    perms: int = 0o444

    def args(self, fds: FdTable) -> list[str]:
        return ["--perms", f"{self.perms:04o}", "--file", str(fds.fd(self.source)), self.dest]


class RemountRo(NamedTuple):
    """Make a mount read-only once everything beneath it is in place (not recursive)."""

    dest: str

    def args(self, fds: FdTable) -> list[str]:
        return ["--remount-ro", self.dest]


class SetEnv(NamedTuple):
    name: str
    value: str

    def args(self, fds: FdTable) -> list[str]:
        return ["--setenv", self.name, self.value]


class FdFlag(NamedTuple):
    """A flag whose argument is a descriptor: --seccomp, --json-status-fd, --sync-fd."""

    flag: str
    item: Data | PathHandle | int

    def args(self, fds: FdTable) -> list[str]:
        fd = self.item if isinstance(self.item, int) else fds.fd(self.item)
        return [self.flag, str(fd)]


Op = (Flag | RoBind | BindFd | DevBind | Symlink | Dir | Tmpfs | Kernel | RoData | CopyFile
      | RemountRo | SetEnv | FdFlag)


class Mount(NamedTuple):
    """A host path made visible inside.  Writable mounts are always bound by descriptor."""

    source: str
    dest: str
    writable: bool = False
    # Open the source first (writable mounts always are); read-only, ``source`` is a resolved
    # path, opened from / without following a link.  Required for anything untrusted can
    # change: every path a user or profile names, as opposed to the system's own.
    by_fd: bool = False
    optional: bool = False  # skip silently when the source does not exist
    # Copy the file (root-owned, world-readable, small: checked by the resolver and again by
    # the launcher) with these permission bits instead of binding it; honoured only under
    # run_mounts' /etc.
    copy_perms: int | None = None


class Sandbox(Record, frozen=True):
    """One sandbox, fully resolved.  Produced by :mod:`corral.resolve`, consumed here."""

    argv: tuple[str, ...]  # the payload, argv[0] an absolute path inside
    init_python: str  # interpreter that runs corral's init inside
    init_source: bytes = field(repr=False)
    init_config: Mapping[str, Any]  # for the init; the launcher adds descriptor numbers
    root_mode: bool  # started by root: no user namespace, the init drops to uid/gid
    uid: int
    gid: int
    disable_userns: bool
    mounts: tuple[Op, ...]  # the filesystem, in order: run_mounts() or agent.agent_mounts()
    files: tuple[tuple[str, bytes], ...] = ()  # more read-only files beside the init's
    seal: tuple[Op, ...] = ()  # after the init file: remounts that make scaffolding read-only
    env: tuple[tuple[str, str], ...] = ()
    chdir: str = "/work"
    hostname: str = "corral"
    seccomp: bytes | None = field(default=None, repr=False)
    ptys: int = 0  # a devpts with max=ptys, made by bwrap's child (corral.mountns); 0: none
    # The compiled init's host path (corral.cinit), bound read-only in place of inner.py and
    # its interpreter; None: the Python init.
    init_binary: str | None = None
    # The payload cannot signal the init (Landlock's signal scope, ABI 6, applies: see
    # corral.resolve.init_shielded).  Where it can, it may SIGSTOP the init, which then
    # no longer watches the launcher: bwrap's --die-with-parent stays the net there.
    init_shielded: bool = False


def _namespace_flags(sb: Sandbox) -> Iterator[Op]:
    if sb.root_mode:
        # No user namespace: bwrap mounts with root's own rights, and the init keeps
        # only what it needs to drop to sb.uid (fact 1: never uid 0 on disk).
        yield Flag(("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                    "--unshare-cgroup-try"))
        yield Flag(("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                    "--cap-add", "CAP_SETPCAP"))
    else:
        yield Flag(("--unshare-all", "--unshare-user"))
        if sb.disable_userns:
            yield Flag(("--disable-userns",))
        yield Flag(("--cap-drop", "ALL"))
    # No --die-with-parent where the init is shielded: it watches the launcher's process
    # instead (inner.py's supervise says why).  Where the payload can stop the init, the
    # flag stays, at the cost of the rare child blocked for ever that supervise names.
    if not sb.init_shielded:
        yield Flag(("--die-with-parent",))
    yield Flag(("--new-session", "--hostname", sb.hostname))


def parents(dest: str, made: set[str], modes: Mapping[str, int] | None = None
            ) -> Iterator[Op]:
    """--dir for each missing parent: bwrap 0.8 makes bind parents mode 0700 otherwise.

    ``modes`` gives each parent's mode inside (the resolver derives it from the host's, so
    that no parent is wider inside than the sandbox's user finds it on the host); 0755
    for a parent it does not name.
    """
    missing = []
    parent = os.path.dirname(dest)
    while parent not in ("/", "") and parent not in made:
        missing.append(parent)
        made.add(parent)
        parent = os.path.dirname(parent)
    for path in reversed(missing):
        yield Dir(path, (modes or {}).get(path, 0o755))


def mount(m: Mount, made: set[str], modes: Mapping[str, int] | None = None) -> Iterator[Op]:
    yield from parents(m.dest, made, modes)
    made.add(m.dest)
    if m.writable:
        yield BindFd(PathHandle(m.source), m.dest, True)
    elif m.by_fd:  # a resolved path: opened without following a link, so one swapped in
        # after the resolver settled it fails the launch instead of choosing what is shown
        yield BindFd(PathHandle(m.source, directory=False, no_links=True), m.dest, False)
    else:
        yield RoBind(m.source, m.dest, m.optional)


def mask(path: str, kind: str) -> list[Op]:
    """``path`` shown empty and read-only: an empty tmpfs, or an empty file."""
    if kind == "dir":
        return [Tmpfs(path, None, 0o755), RemountRo(path)]
    return [RoData(Data(path, b""), path, 0o444)]


# /proc files that describe the launcher's session despite a fresh procfs: /proc/keys lists
# the descriptions of the keys in the keyrings the launcher can see (seccomp keeps their
# contents out of reach, not this listing).
PROC_EMPTIED = ("/proc/keys", "/proc/key-users")
# bwrap's root tmpfs read-only, after every mount and file (not recursive: each mount keeps
# its own flags).  Started by a plain user, that tmpfs and the directories bwrap makes on
# it are the user's own; without this only Landlock refused a write to / or /etc.
ROOT_SEAL = RemountRo("/")
# bwrap's /dev tmpfs read-only once /dev/shm, /dev/pts and the device nodes are bound on
# it (each keeps its own flags).  Started by a plain user it is the payload's own
# directory, writable at the mount: the payload could chmod it, and only Landlock stopped
# new entries there.  In every sandbox's seal, run mode and agent mode alike.
DEV_SEAL = RemountRo("/dev")
PTS_TMPFS_BYTES = 4096


def kernel_filesystems(shm_bytes: int, ptys: int) -> list[Op]:
    """A fresh /proc (with PROC_EMPTIED emptied), a minimal /dev, a sized /dev/shm, and
    pseudo-terminals only from a devpts of at most ``ptys`` (none for 0).

    bwrap's own devpts has no ``max=``: one sandbox could take every pty the kernel
    allows, and other sandboxes would get ENOSPC from /dev/ptmx.  It is covered either
    by the bounded instance bwrap's child mounted over the host's /dev/pts in its
    private namespace (see corral.mountns), or by an empty read-only directory, so that
    /dev/ptmx (a link to pts/ptmx) leads nowhere.
    """
    pts: list[Op] = ([DevBind("/dev/pts", "/dev/pts")] if ptys else
                     [Tmpfs("/dev/pts", PTS_TMPFS_BYTES, 0o755), RemountRo("/dev/pts")])
    return [Kernel("--proc", "/proc"),
            *(RoData(Data(path, b""), path, 0o444) for path in PROC_EMPTIED),
            Kernel("--dev", "/dev"), Tmpfs("/dev/shm", shm_bytes, 0o1777), *pts]


def run_mounts(usr_links: Sequence[tuple[str, str]], base: Sequence[Mount],
               writable: Sequence[Mount], files: Sequence[tuple[str, bytes]],
               tmp_bytes: int, shm_bytes: int, modes: Mapping[str, int] | None = None,
               masks: Sequence[tuple[str, str]] = (), ptys: int = 0) -> list[Op]:
    """The filesystem of ``corral run``: steps 2 to 5 and 7 of the module docstring.

    ``usr_links`` are usr-merge symlinks such as ``("usr/bin", "/bin")``;
    ``files`` are generated read-only files such as ``/etc/passwd``; ``modes``: see
    :func:`parents`; ``masks`` are (path, "file" or "dir") inside read-only mounts to
    show empty (credentials in a ``--ro`` folder).

    The generated ``/etc`` files and the host's small ones (``Mount.copy_perms``) are
    copied onto bwrap's root tmpfs, with no mount each (each bind made bwrap re-read
    /proc/self/mountinfo); directories are bound as before.  The sandbox's seal must be
    ROOT_SEAL (build_ops checks).  A generated file that a caller's mount covers is bound
    over it as before, so that it still wins.
    """
    made: set[str] = {"/usr", "/proc", "/dev", "/tmp"}
    ops: list[Op] = [RoBind("/usr", "/usr")]
    ops.extend(Symlink(target, link) for target, link in usr_links)
    # Scratch before the read-only extras, so that an extra under /tmp is not covered.
    ops += [*kernel_filesystems(shm_bytes, ptys), Tmpfs("/tmp", tmp_bytes, 0o1777)]
    for m in base:
        if m.copy_perms is not None and m.dest.startswith("/etc/") and not m.writable:
            ops.extend(parents(m.dest, made, modes))
            ops.append(CopyFile(HostFile(m.source), m.dest, m.copy_perms))
        else:
            ops.extend(mount(m, made, modes))
    ops.extend(op for path, kind in masks for op in mask(path, kind))
    for m in writable:
        ops.extend(mount(m, made, modes))
    covering = [m.dest for m in (*base, *writable) if m.copy_perms is None]
    for dest, content in files:
        ops.extend(parents(dest, made))
        if dest.startswith("/etc/") and not _covered(dest, covering):
            ops.append(CopyFile(Data(dest, content), dest))
        else:
            ops.append(RoData(Data(dest, content), dest))
    return ops


def _covered(path: str, mounts: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in mounts)


def build_ops(sb: Sandbox, status_fd: int | None = None) -> list[Op]:
    """The ordered operations for ``sb``; see the module docstring for the order.

    ``status_fd`` is the launcher's descriptor for bwrap's --json-status-fd.
    """
    ops: list[Op] = list(_namespace_flags(sb))
    ops.extend(sb.mounts)
    ops.append(Dir(os.path.dirname(INIT_PATH)))
    if sb.init_binary is not None:  # bound, not copied: --ro-bind-data of it took 1.5 ms
        ops.append(BindFd(PathHandle(sb.init_binary, directory=False), CINIT_PATH, False))
    else:
        ops.append(RoData(Data(INIT_PATH, sb.init_source), INIT_PATH))
    for dest, content in sb.files:
        ops.append(RoData(Data(dest, content), dest))
    ops.extend(sb.seal)
    if sb.seal[-1:] != (ROOT_SEAL,) and any(isinstance(op, CopyFile) for op in sb.mounts):
        raise ValueError("corral.bwrap: files copied onto the root need ROOT_SEAL last")
    ops.append(Flag(("--clearenv",)))  # before any --setenv (fact 11)
    ops.extend(SetEnv(name, value) for name, value in init_environment(sb))
    ops.append(Flag(("--chdir", "/")))  # the init changes to sb.chdir once it is the payload's uid
    if sb.seccomp is not None:
        ops.append(FdFlag("--seccomp", Data("seccomp", sb.seccomp)))
    if status_fd is not None:
        ops.append(FdFlag("--json-status-fd", status_fd))
    return ops


def init_environment(sb: Sandbox) -> tuple[tuple[str, str], ...]:
    """The variables bwrap sets for corral's init: none.

    The init is trusted until it execs the payload, and its interpreter and C library obey
    their environment (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``GLIBC_TUNABLES``, ``GCONV_PATH``,
    ...).  ``sb.env`` is the payload's, and partly the request's (``corral batch``,
    ``corral serve``): the init receives it in its config and passes it to ``execve`` only.
    """
    return ()


def init_config(sb: Sandbox) -> dict[str, Any]:
    """The init's config as the launcher hands it over, descriptor numbers aside."""
    return {**sb.init_config, "env": [list(pair) for pair in sb.env]}


def command(sb: Sandbox, config_fd: int) -> list[str]:
    """The words after ``--``: corral's init, its config descriptor, then the payload."""
    if sb.init_binary is not None:
        return [CINIT_PATH, str(config_fd), *sb.argv]
    return [sb.init_python, "-I", "-S", "-B", INIT_PATH, str(config_fd), *sb.argv]


def render(ops: Iterable[Op], fds: FdTable) -> list[str]:
    """Flatten ``ops`` into bwrap's argument words."""
    return [word for op in ops for word in op.args(fds)]


def render_lines(ops: Sequence[Op], fds: FdTable) -> list[str]:
    """One shell-quoted line per operation, for ``--dry-run``."""
    import shlex  # only a dry run quotes: ~0.8 M instructions of every start otherwise

    return [shlex.join(op.args(fds)) for op in ops]
