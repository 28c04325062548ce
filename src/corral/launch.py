"""Launch: start bwrap, supervise the run, kill it whole, reap everything.

One :class:`Launch` owns every process and descriptor of one run.  bwrap
gets its arguments through ``--args`` (no E2BIG, and nothing secret in the
host's process list), a minimal environment, and exactly the descriptors it
needs.  The sandbox's PID 1, reported by ``--json-status-fd``, is what a
timeout kills: killing it ends the whole PID namespace (DESIGN fact 4),
where killing bwrap alone would not.

Descriptors handed over:

* ``--args``, generated files, seccomp: memfds, read by bwrap during setup;
* the init's config (memfd) and status pipe, read and written by corral's init;
* bwrap's own stderr goes to a pipe, so a setup failure becomes one clear
  line; the payload's real stderr is passed separately and moved to fd 2
  by the init.
"""

from __future__ import annotations

import marshal
import os
import select
import stat
import sys
import time

from . import bwrap, cinit, fsops, jsonio, small
from . import sig as signal
from .bwrap import Data, HostFile, PathHandle, Sandbox
from .errors import HostError, LaunchError
from .record import Record, field

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

    from .cgroups import RunCgroup
    from .mountns import ChildMounts
    from .tty import Freezer, Terminal
    from .watch import Watch

__all__ = ["Launch", "Outcome", "launch"]

PIPE_CHUNK = 1 << 16
ERROR_CAP = 1 << 16
KILL_GRACE_S = 30.0  # after SIGKILL, how long to wait for bwrap to go before giving up
LIMIT_STATUSES = ("timeout", "output-limit", "disk-limit")  # corral ended the run
CORRAL_FAILED = 125  # the exit status of a run corral could not set up or see through
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class Outcome(Record):
    """What happened to one run, before the workspace is looked at."""

    status: str  # exited, signaled, timeout, output-limit, disk-limit, error (oom: see api)
    exit_code: int
    signal: int | None = None
    error: str | None = None  # status "error": why corral cannot say how the command ended
    wall_s: float = 0.0
    stdout: bytes | None = None
    stderr: bytes | None = None
    truncated: bool = False
    sandbox_pid: int | None = None  # host pid of the sandbox's PID 1
    events: list[dict[str, Any]] = field(default_factory=list)


class Handles:
    """The descriptors bwrap reads: generated data as memfds, paths as O_PATH handles.

    ``preset`` gives the descriptor for a path handle instead of opening the path:
    a workspace image's detached mount (see :mod:`corral.diskimage`); a copy is
    used, so the caller keeps its own.
    """

    def __init__(self, preset: dict[PathHandle, int] | None = None) -> None:
        self._by_key: dict[object, int] = {}
        self._more: list[int] = []
        self.preset = preset or {}

    def fd(self, item: Data | PathHandle | HostFile) -> int:
        """A descriptor of its own for each use: bwrap closes what a bind, a file or a
        data argument hands it (a profile's read-only ``~/.gitconfig`` that is a link to a
        protected file in the project is bound twice, from one handle).  A path handle
        used again is a duplicate (the same object as resolved once); data and host
        files are opened again (a duplicate would share the read offset)."""
        if item in self._by_key:
            again = (os.dup(self._by_key[item]) if isinstance(item, PathHandle)
                     else self._open(item))
            self._more.append(again)
            return again
        given = self.preset.get(item) if isinstance(item, PathHandle) else None
        self._by_key[item] = self._open(item) if given is None else os.dup(given)
        return self._by_key[item]

    @staticmethod
    def _open(item: Data | PathHandle | HostFile) -> int:
        if isinstance(item, HostFile):
            try:
                return fsops.open_host_file(item.path)
            except OSError as e:
                raise LaunchError(f"cannot copy {item.path} into the sandbox",
                                  e.strerror or "", "start again") from None
        if isinstance(item, PathHandle):
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            if item.directory:
                flags |= os.O_DIRECTORY
            try:
                fd = _open_handle(item.path, flags, item.no_links)
            except OSError as e:
                raise LaunchError(f"cannot open {item.path} for binding", e.strerror or "",
                                  "check that it exists and is not a symlink") from None
            if stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW opens the link itself
                os.close(fd)
                raise LaunchError(f"{item.path} became a symlink while corral was starting",
                                  "binding it would follow the link", "start again")
            return fd
        return memfd(item.name, item.content)

    def all(self) -> list[int]:
        return [*self._by_key.values(), *self._more]

    def close(self) -> None:
        for fd in self.all():
            with small.suppress(OSError):
                os.close(fd)
        self._by_key.clear()
        self._more.clear()


def _open_handle(path: str, flags: int, no_links: bool) -> int:
    """``path`` opened with ``flags``; with ``no_links``, from ``/`` without following a
    link in any component (see corral.fsops): a swapped-in link fails, never leads out."""
    held = fsops.open_held(path, flags)  # in a tree the run holds: through its descriptor
    if held is not None:
        return held
    return fsops.open_no_links(path, flags) if no_links else os.open(path, flags)


def limit_exit_code(status: str) -> int:
    """The exit status of a run corral ended, or found over a limit once it ended, with
    ``status`` (one of LIMIT_STATUSES): 124 for "timeout", else 137 (SIGKILL's).  Never
    the command's own, so that a caller reading only the exit status cannot take a run
    over its limits for a success."""
    return 124 if status == "timeout" else 128 + signal.SIGKILL


def memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create("corral-" + name.strip("/").replace("/", "-"), os.MFD_CLOEXEC)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _translate(stderr: str, host_hint: str) -> LaunchError | HostError:
    """bwrap's raw setup error, as one line that names the cause and the fix."""
    text = " ".join(line.removeprefix("bwrap: ") for line in stderr.strip().splitlines()) \
        or "bwrap exited before the sandbox started"
    userns = ("setting up uid map", "RTM_NEWADDR", "No permissions to create",
              "Creating new namespace failed", "Operation not permitted")
    if any(s in text for s in userns):
        return HostError(f"bwrap could not create the sandbox's namespaces ({text})",
                         "unprivileged user namespaces are disabled or restricted here"
                         + host_hint,
                         "run 'corral doctor' for this host's cause and fix")
    if text.startswith("corral-join: "):  # the compiled init's --join mode (corral.cinit)
        return HostError("bwrap could not be started inside the run's cgroup and mounts",
                         text.split(": ", 1)[1],
                         "run 'corral doctor' to see what this host enforces")
    if "make / slave" in text:
        return HostError(f"bwrap could not set up mounts ({text})",
                         "this looks like a container without mount rights",
                         "run corral on the host, or give the container user namespaces")
    if "Can't find source path /proc/self/fd/" in text:
        # bwrap 0.8 resolves a bound descriptor to its path first: a directory that was
        # deleted after corral opened it has no path left (seen when a test's clean-up
        # removed another session's project).
        return LaunchError("a directory to bind was deleted while the sandbox started",
                           f"bwrap found it gone ({text})",
                           "check what removes it, and run again")
    if "Race condition binding dirfd" in text:
        return LaunchError("a directory to bind was replaced while the sandbox started",
                           "something is changing the workspace concurrently",
                           "stop the other process and run again")
    return LaunchError(f"bwrap failed to set up the sandbox: {text}", "", "")


def _terminal(stdin: bool) -> Terminal | None:
    """tty.Terminal.attach, whose module (termios and all) is imported only when one of
    corral's descriptors is a terminal."""
    if not ((stdin and os.isatty(0)) or os.isatty(1) or os.isatty(2)):
        return None
    from .tty import Terminal

    return Terminal.attach(stdin=stdin)


class Poller:
    """What supervise needs of selectors' epoll selector, on select.epoll itself (selectors
    and the math it imports cost every command line's start ~1 ms): the registered
    descriptors, and which of them are ready (for reading or writing as registered, or
    hung up or failed)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.fds: set[int] = set()

    def register(self, fd: int, write: bool = False) -> None:
        self.epoll.register(fd, select.EPOLLOUT if write else select.EPOLLIN)
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self.fds.remove(fd)
        self.epoll.unregister(fd)

    def select(self, timeout: float | None) -> list[int]:
        # Rounded up to the millisecond, epoll's unit: down, a wait of 0.3 ms would return
        # at once, again and again, until the deadline.
        wait = -1.0 if timeout is None else -(-timeout * 1000 // 1) / 1000
        return [fd for fd, _ in self.epoll.poll(wait, max(len(self.fds), 1))]

    def close(self) -> None:
        self.epoll.close()


DEVNULL = -3  # the payload's stdin is /dev/null (subprocess.DEVNULL's value)


class Spawned:
    """bwrap's process, as the launch uses it: ``pid``, :meth:`poll`, :meth:`wait` (raising
    TimeoutError), :meth:`kill` and ``returncode`` (negative for a signal), as
    subprocess.Popen has them.  Started by :func:`spawn`: with the compiled init, through
    ``os.posix_spawn`` (the command line then never imports subprocess, which with what it
    imports, locale, re, signal's enums, selectors, was about a sixth of every ``corral
    run``'s own CPU); with the Python init, by subprocess with its preexec_fn."""

    def __init__(self, pid: int, popen: Any = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._popen = popen

    def poll(self) -> int | None:
        if self._popen is not None:
            self.returncode = self._popen.poll()
        elif self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._popen is not None:
            import subprocess

            try:
                self.returncode = int(self._popen.wait(timeout))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"bwrap still runs after {timeout} s") from None
            return self.returncode
        if self.returncode is None and timeout is not None:
            fd = os.pidfd_open(self.pid)  # not reaped yet: this pid is still bwrap
            try:
                if not select.select([fd], [], [], timeout)[0]:
                    raise TimeoutError(f"bwrap still runs after {timeout} s")
            finally:
                os.close(fd)
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored): as Popen does
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        if self._popen is not None:
            self._popen.kill()
        elif self.returncode is None:  # not reaped: the pid is still bwrap's
            os.kill(self.pid, signal.SIGKILL)


def default_signals() -> Callable[[], None]:
    """What the joiner does (see init_join.c), as a step for bwrap's child before exec with
    the Python init: every signal at its default and none blocked, whatever this process
    had.  Made here, in the parent: the libc refuses its reserved numbers (32 and 33,
    left ignored in a process glibc's posix_spawn started, and so in its children: review
    12), which the raw ``rt_sigaction`` takes, through ctypes loaded beforehand."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nr = signal.RT_SIGACTION.get(os.uname().machine)
    zero = (ctypes.c_ulong * 4)()  # SIG_DFL, no flags, an empty mask
    usable = signal.valid_signals()
    reserved = [n for n in range(1, 65) if n not in usable] if nr is not None else []

    def step() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        for n in usable:
            if n not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(n, signal.SIG_DFL)
        for number in reserved:
            if libc.syscall(nr, number, zero, None, 8) != 0:
                raise OSError(ctypes.get_errno(), f"cannot reset signal {number}")

    return step


def spawn(argv: Sequence[str], *, stdin: int | None, stdout: int | None, stderr: int,
          keep: Sequence[int], joiner: bool, preexec: Callable[[], None] | None = None
          ) -> Spawned:
    """Start ``argv`` with ``stdin`` (None: inherited; DEVNULL), ``stdout`` (None:
    inherited) and ``stderr``, an empty environment, and of this process's descriptors only
    ``keep`` besides; in ``/``, with SIGPIPE and SIGXFSZ at their defaults (Python ignores
    both).  ``joiner``: ``argv`` starts with the compiled init's ``--join --keep`` (the
    list being ``keep``), which makes / its directory and closes every other descriptor
    before it execs bwrap; then the start is ``posix_spawn`` (vfork and exec), where each
    kept descriptor is made inheritable in the child alone (a dup2 onto itself, which
    clears close-on-exec there: POSIX 2024, glibc 2.29).  Otherwise, or when a descriptor
    to hand over is 0, 1 or 2 (a caller whose standard streams are closed: dup2s in order
    could overwrite one another), subprocess, as before."""
    given = [fd for fd in (stdin, stdout, stderr, *keep) if fd is not None and fd != DEVNULL]
    if joiner and preexec is None and min(given, default=3) >= 3:
        actions: list[tuple[Any, ...]] = []
        if stdin == DEVNULL:
            actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
        elif stdin is not None:
            actions.append((os.POSIX_SPAWN_DUP2, stdin, 0))
        if stdout is not None:
            actions.append((os.POSIX_SPAWN_DUP2, stdout, 1))
        actions.append((os.POSIX_SPAWN_DUP2, stderr, 2))
        actions += [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in keep]
        pid = os.posix_spawn(argv[0], list(argv), {}, file_actions=actions,
                             setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        return Spawned(pid)
    import subprocess

    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL if stdin == DEVNULL else stdin, stdout=stdout,
        stderr=stderr, pass_fds=list(keep), close_fds=True, env={}, cwd="/",
        restore_signals=True, preexec_fn=preexec)
    return Spawned(proc.pid, proc)


def _init_died(code: int) -> str:
    how = f"signal {code - 128}" if code > 128 else f"signal {-code}" if code < 0 \
        else f"exit status {code}"
    return (f"corral's init died after the command started (bwrap reported {how}); how the "
            "command ended is unknown, and the command itself may have caused it; treat the "
            "run as failed, and run it again")


class Launch:
    """Owns one run: spawn with :meth:`start`, then :meth:`supervise`; always :meth:`close`."""

    def __init__(self, sb: Sandbox, *, capture: bool, stdin: bytes | None, output_cap: int,
                 timeout_s: float | None, bwrap_path: str, host_hint: str = "",
                 extra_fds: Sequence[int] = (),
                 cgroup: RunCgroup | None = None, watch: Watch | None = None,
                 mounts: ChildMounts | None = None,
                 preset: dict[PathHandle, int] | None = None) -> None:
        self.sb = sb
        self.capture = capture
        self.stdin_data = stdin
        self.output_cap = output_cap
        self.timeout_s = timeout_s
        self.bwrap_path = bwrap_path
        self.host_hint = host_hint
        self.extra_fds = list(extra_fds)
        self.cgroup = cgroup  # bwrap starts inside it (see corral.cgroups)
        self.watch = watch  # disk and CPU-time checks while the run lives
        self.mounts = mounts  # made by bwrap's child in a private mount namespace
        self.handles = Handles(preset)
        self.fds: list[int] = []  # our own ends, closed by close()
        self.payload_cgroups: list[int] = []  # for the init (RunCgroup.payload_files)
        self.proc: Spawned | None = None
        self.pid1_fd: int | None = None
        self.outcome = Outcome(status="error", exit_code=CORRAL_FAILED)
        # Interactive: the sandbox gets a pty of ours, never the user's terminal (corral.tty).
        self.terminal = None if capture else _terminal(stdin is None)

    # -- setup ---------------------------------------------------------------

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self.fds += [r, w]
        return r, w

    def argv(self, status_w: int, json_w: int, stderr_fd: int,
             launcher_fd: int) -> tuple[list[str], list[int]]:
        """bwrap's argv and the descriptors it must inherit."""
        config = dict(bwrap.init_config(self.sb), status_fd=status_w, stderr_fd=stderr_fd,
                      cwd=self.sb.chdir, launcher_fd=launcher_fd)
        if self.payload_cgroups:
            config["payload_cgroups"] = list(self.payload_cgroups)
        if self.terminal is not None:  # the descriptor the init makes its terminal
            config["tty"] = self.terminal.sandbox_fd(stderr_fd)
        encoded = marshal.dumps(config) if self.sb.init_binary is None else cinit.encode(config)
        config_fd = self.handles.fd(Data("init-config", encoded))
        ops = bwrap.build_ops(self.sb, status_fd=json_w)
        words = bwrap.render(ops, self.handles)
        # os.fsencode's codec: a path from the project may not be UTF-8; it must reach bwrap
        # as is.  One encode of the joined words (what fsencode gives word by word).
        args = "".join(w + "\0" for w in words).encode(_FS_ENCODING, _FS_ERRORS)
        args_fd = memfd("args", args)
        self.fds.append(args_fd)
        argv = [self.bwrap_path, "--args", str(args_fd), "--", *bwrap.command(self.sb, config_fd)]
        # json_r too: bwrap writes --json-status-fd before it lets its sandbox child go on,
        # and dies if that write fails; with the launcher already gone (SIGKILLed while bwrap
        # set up) that was EPIPE, leaving the child blocked for ever on bwrap's eventfd.
        # With a reader of its own, bwrap goes on, and the init, watching launcher_fd (a
        # pidfd of this process), ends the sandbox (inner.py's supervise).
        keep = [args_fd, status_w, json_w, self.json_r, launcher_fd, stderr_fd,
                *self.payload_cgroups, *self.handles.all(), *self.extra_fds]
        return argv, keep

    def start(self) -> None:
        self.status_r, status_w = self._pipe()
        self.json_r, json_w = self._pipe()
        self.err_r, err_w = self._pipe()
        if self.capture:
            self.out_r, out_w = self._pipe()
            self.cerr_r, cerr_w = self._pipe()
            stdout: int | None = out_w
            stderr_fd = cerr_w
        else:
            # A copy: in bwrap, fd 2 itself becomes the pipe for bwrap's own errors.
            stdout, stderr_fd = None, os.dup(2)
            self.fds.append(stderr_fd)
        stdin: int | None = DEVNULL if self.capture else None
        if self.stdin_data is not None:
            self.in_r, self.in_w = self._pipe()
            stdin = self.in_r
            os.set_blocking(self.in_w, False)
        if self.terminal is not None:
            stdin = self.terminal.child_fd(0) if stdin is None else stdin
            stdout = self.terminal.child_fd(1)
            if (pty_err := self.terminal.child_fd(2)) is not None:
                self._close(stderr_fd)
                stderr_fd = pty_err
        launcher_fd = os.pidfd_open(os.getpid())
        self.fds.append(launcher_fd)
        for path in self.cgroup.payload_files() if self.cgroup is not None else ():
            self.payload_cgroups.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
            self.fds.append(self.payload_cgroups[-1])
        argv, keep = self.argv(status_w, json_w, stderr_fd, launcher_fd)

        def popen(preexec: Callable[[], None] | None, join: Sequence[str] | None = None,
                  more_fds: Sequence[int] = ()) -> Spawned:
            """``join``: the cgroup files and mount options for the compiled init's
            ``--join``, which then starts bwrap; None: bwrap itself."""
            fds = [*keep, *more_fds]
            prefix = None if join is None else cinit.join_prefix(
                self.sb.init_binary, join, (), fds)
            return spawn([*(prefix or ()), *argv], stdin=stdin, stdout=stdout, stderr=err_w,
                         keep=fds, joiner=prefix is not None, preexec=preexec)

        self.started_at = time.monotonic()
        try:
            self.proc = self._spawn(popen)
        except OSError as e:
            raise LaunchError(f"cannot start {self.bwrap_path}", e.strerror or str(e),
                              "check the bwrap installation") from None
        finally:
            self.handles.close()
            for fd in (status_w, json_w, err_w, launcher_fd,
                       *([out_w, cerr_w] if self.capture else [])):
                self._close(fd)
            if not self.capture:
                self._close(stderr_fd)
            if self.stdin_data is not None:
                self._close(self.in_r)
        if self.terminal is not None:
            self.terminal.started(self._freezer())

    def _spawn(self, popen: Callable[[Callable[[], None] | None, Sequence[str] | None,
                                      Sequence[int]], Spawned]) -> Spawned:
        """Start bwrap; its child first joins the run's cgroups, then makes its mounts.

        Both happen between fork and exec, in the child alone (see corral.cgroups and
        corral.mountns); a failed step fails the child before exec, so nothing starts
        unlimited or without its mounts.  With the compiled init built, its ``--join``
        mode does both (and closes what bwrap must not get) and then execs bwrap
        (corral.cinit.join_prefix), with or without a cgroup or mounts: no Python
        preexec_fn, and the launcher starts it with posix_spawn (:func:`spawn`).
        """
        mounts = self._child_mounts()
        if mounts is not None and not mounts.wanted:
            mounts = None
        mount_args, mount_fds = mounts.joiner_args() if mounts is not None else ([], [])
        files = self.cgroup.join_files() if self.cgroup is not None else []
        if self.sb.init_binary is not None:
            return popen(None, [*files, *mount_args], mount_fds)
        steps = [default_signals()]
        if self.cgroup is not None:
            steps.append(self.cgroup.child_step())
        if mounts is not None:
            steps.append(mounts.step)

        def child() -> None:
            for step in steps:
                step()

        import subprocess

        try:
            return popen(child, None, ())
        except subprocess.SubprocessError as e:
            raise HostError("bwrap could not be started inside the run's cgroup and mounts",
                            str(e), "run 'corral doctor' to see what this host enforces"
                            ) from None

    def _child_mounts(self) -> ChildMounts | None:
        """The caller's mounts, plus the bounded devpts any sandbox with ``ptys`` needs.

        Made here, from the sandbox itself, so that no way of launching one can forget
        it: bwrap would otherwise bind the host's own /dev/pts in its place.
        """
        if not self.sb.ptys:
            return self.mounts
        from .mountns import ChildMounts

        mounts = self.mounts or ChildMounts(own_userns=not self.sb.root_mode)
        mounts.bounded_devpts(self.sb.ptys)
        return mounts

    def _freezer(self) -> Freezer:
        """What ^Z freezes the run with: its v2 cgroup, root's v1 freezer, or signals."""
        v2 = self.cgroup.unique[0] if self.cgroup and self.cgroup.version == 2 else None
        v1 = None
        if v2 is None and os.geteuid() == 0:
            from .host import detect

            mount = detect().cgroups.v1_mount("freezer")
            v1 = os.path.join(mount, "corral", f"tty-{os.urandom(6).hex()}") if mount else None
        from .tty import Freezer

        return Freezer(lambda: self.outcome.sandbox_pid, v2, v1)

    def _close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.remove(fd)
            os.close(fd)

    # -- supervision ---------------------------------------------------------

    def supervise(self) -> Outcome:
        """Wait for the run to end (or end it), reading every pipe with caps."""
        assert self.proc is not None
        o = self.outcome
        bufs: dict[int, bytearray] = {}
        sel = Poller()
        readers = [self.status_r, self.json_r, self.err_r]
        if self.capture:
            readers += [self.out_r, self.cerr_r]
        for fd in readers:
            bufs[fd] = bytearray()
            sel.register(fd)
        if self.stdin_data is not None:
            self._stdin_view = memoryview(self.stdin_data)
            sel.register(self.in_w, write=True)
        relayed = self.terminal.fds() if self.terminal is not None else []
        for fd in relayed:
            sel.register(fd)
        if relayed:
            readers.append(relayed[0])  # the pty's output is drained like a pipe
        proc_fd = os.pidfd_open(self.proc.pid)
        self.fds.append(proc_fd)
        sel.register(proc_fd)
        watch_fd = self.watch.fileno() if self.watch is not None else None
        if watch_fd is not None:
            sel.register(watch_fd)
        deadline = None if self.timeout_s is None else self.started_at + self.timeout_s
        exited = False
        try:
            while sel.fds:
                if exited and all(fd not in sel.fds for fd in readers):
                    break
                now = time.monotonic()
                wait = None if deadline is None else max(0.0, deadline - now)
                due = None if exited else self._watch_due()
                if due is not None:  # wake for the next limit check too
                    wait = max(0.0, due - now) if wait is None else min(wait, max(0.0, due - now))
                events = sel.select(wait)
                if due is not None and time.monotonic() >= due:
                    self._check_limits()
                if not events and deadline is not None and time.monotonic() >= deadline:
                    if o.status not in LIMIT_STATUSES:
                        o.status = "timeout"
                        self.kill()
                    deadline = time.monotonic() + KILL_GRACE_S
                    if exited:
                        break
                    continue
                for fd in events:
                    if fd == watch_fd:
                        sel.unregister(fd)
                        if self.watch is not None and not exited:  # after exit: its finish()
                            self._limit(self.watch.verdict())
                    elif fd == proc_fd:
                        sel.unregister(fd)
                        exited = True
                        # bwrap reports once the init has ended: whatever is left in the
                        # sandbox (the init killed, say) ends now, not at the grace's end.
                        self._kill_pid1()
                        # Writers are all gone once bwrap is; drain, but do not wait forever.
                        deadline = time.monotonic() + KILL_GRACE_S
                    elif self.stdin_data is not None and fd == self.in_w:
                        self._feed(sel)
                    elif fd in relayed:
                        if not self._relay(fd):
                            sel.unregister(fd)
                    else:
                        self._read(sel, fd, bufs)
        finally:
            sel.close()
        self.proc.wait()
        o.wall_s = time.monotonic() - self.started_at
        if self.capture:
            o.stdout, o.stderr = bytes(bufs[self.out_r]), bytes(bufs[self.cerr_r])
        self._finish(bytes(bufs[self.err_r]))
        return o

    def _relay(self, fd: int) -> bool:
        assert self.terminal is not None
        try:
            return self.terminal.ready(fd)
        except OSError:  # the user's terminal is gone (hung up): stop reading it
            return False

    def _watch_due(self) -> float | None:
        if self.watch is None or self.outcome.status in LIMIT_STATUSES:
            return None
        return self.watch.due()

    def _check_limits(self) -> None:
        assert self.watch is not None
        self._limit(self.watch.check())

    def _limit(self, status: str | None) -> None:
        """End the run with ``status`` (unless corral already ended it for another limit)."""
        if status is not None and self.outcome.status not in LIMIT_STATUSES:
            self.outcome.status = status
            self.kill()

    def _feed(self, sel: Poller) -> None:
        try:
            n = os.write(self.in_w, self._stdin_view[:PIPE_CHUNK])
            self._stdin_view = self._stdin_view[n:]
        except BlockingIOError:
            return
        except OSError:
            self._stdin_view = memoryview(b"")
        if not self._stdin_view:
            sel.unregister(self.in_w)
            self._close(self.in_w)

    def _read(self, sel: Poller, fd: int, bufs: dict[int, bytearray]) -> None:
        try:
            chunk = os.read(fd, PIPE_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(fd)
            return
        buf = bufs[fd]
        if fd in (self.status_r, self.json_r):
            buf += chunk
            self._events(fd, buf)
            return
        cap = self.output_cap if fd != self.err_r else ERROR_CAP
        room = cap - len(buf)
        buf += chunk[:max(room, 0)]
        if len(chunk) > room and fd != self.err_r:
            self.outcome.truncated = True
            if self.outcome.status not in LIMIT_STATUSES:
                self.outcome.status = "output-limit"
                self.kill()

    def _events(self, fd: int, buf: bytearray) -> None:
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            try:
                event = jsonio.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if fd == self.json_r and "child-pid" in event:
                self._adopt_pid1(int(event["child-pid"]))
            elif fd == self.status_r:
                self.outcome.events.append(event)

    def _adopt_pid1(self, pid: int) -> None:
        """Hold a pidfd on the sandbox's PID 1; check it is bwrap's child, not a reused pid."""
        assert self.proc is not None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            ppid = -1
        if ppid != self.proc.pid:
            os.close(fd)
            return
        self.pid1_fd = fd
        self.fds.append(fd)
        self.outcome.sandbox_pid = pid

    def _kill_pid1(self) -> None:
        """SIGKILL the sandbox's PID 1, which ends its whole PID namespace."""
        if self.pid1_fd is not None:
            with small.suppress(OSError):
                signal.pidfd_send_signal(self.pid1_fd, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the sandbox's PID 1, which ends its whole PID namespace; then bwrap."""
        self._kill_pid1()
        if self.proc is not None and self.proc.poll() is None:
            with small.suppress(OSError):
                self.proc.kill()

    def _finish(self, err: bytes) -> None:
        o = self.outcome
        assert self.proc is not None
        started = any(e.get("event") == "started" for e in o.events)
        failure = next((e for e in o.events if e.get("event") == "error"), None)
        if o.status in LIMIT_STATUSES:
            o.exit_code = limit_exit_code(o.status)
            return
        if failure is not None:
            raise LaunchError(f"corral's init could not start the command: {failure['message']}",
                              "", "")
        if not started:
            raise _translate(err.decode(errors="replace"), self.host_hint)
        end = next((e for e in reversed(o.events) if e.get("event") in ("exited", "signaled")),
                   None)
        if end is None:
            # The init died before it could say how the command ended.  Whatever bwrap
            # reports is the init's fate, not the command's, and the payload may have
            # caused it: never hand it back as the command's own outcome.
            o.status, o.exit_code, o.error = "error", CORRAL_FAILED, _init_died(
                self.proc.wait())
        elif end["event"] == "signaled":
            o.status, o.signal, o.exit_code = "signaled", int(end["signal"]), 128 + int(
                end["signal"])
        else:
            o.status, o.exit_code = "exited", int(end["code"])

    def close(self) -> None:
        """Kill whatever is left, reap bwrap, close every descriptor."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
            with small.suppress(TimeoutError):
                self.proc.wait(KILL_GRACE_S)
        else:  # bwrap gone first (the OOM killer?): its sandbox too
            self._kill_pid1()
        self.handles.close()
        for fd in self.fds:
            with small.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.terminal is not None:
            self.terminal.close()


@small.contextmanager
def launched(sb: Sandbox, **kwargs: Any) -> Iterator[Launch]:
    run = Launch(sb, **kwargs)
    try:
        run.start()
        yield run
    finally:
        run.close()


def launch(sb: Sandbox, **kwargs: Any) -> Outcome:
    """Run ``sb`` to completion; see :class:`Launch` for the keyword arguments."""
    with launched(sb, **kwargs) as run:
        return run.supervise()


class Numbering:
    """An FdTable for --dry-run: numbers descriptors in order and opens nothing."""

    def __init__(self, first: int = 3) -> None:
        self.items: list[tuple[Data | PathHandle | HostFile, int]] = []
        self.first = first

    def fd(self, item: Data | PathHandle | HostFile) -> int:
        # a number for each use, as Handles gives a descriptor for each
        self.items.append((item, self.first + len(self.items)))
        return self.items[-1][1]


def dry_run_lines(sb: Sandbox, bwrap_path: str) -> list[str]:
    """The bwrap invocation :func:`launch` would make, one operation per line.

    Descriptor numbers are placeholders: real ones are assigned at launch.
    """
    import shlex  # (only a dry run quotes)

    fds = Numbering()
    config_fd = fds.fd(Data("init-config", b""))
    ops = bwrap.build_ops(sb, status_fd=None)
    lines = [f"{bwrap_path} --args FD -- COMMAND  # FD holds these, NUL-separated:"]
    lines += ["  " + line for line in bwrap.render_lines(ops, fds)]
    lines.append("COMMAND: " + shlex.join(bwrap.command(sb, config_fd)))
    if sb.ptys:
        lines.append(f"# /dev/pts: a devpts with max={sb.ptys}, mounted by bwrap's child in "
                     "a private mount namespace before it execs bwrap")
    for item, fd in fds.items:
        what = item.name if isinstance(item, Data) else item.path
        lines.append(f"# fd {fd}: {what}")
    lines.append("# init config: " + jsonio.dumps(bwrap.init_config(sb), sort_keys=True))
    return lines
