"""corral's init: the first program bwrap starts inside every sandbox.

It runs as ``python3 -I -S -B /run/corral/init.py CONFIG_FD ARGV...`` and uses
only the standard library, because it is handed into the sandbox as a
single file (``--ro-bind-data``): the payload must not depend on reading
corral's checkout or virtualenv.  In order, it:

 1. reads its JSON config from CONFIG_FD (never from argv: other host users
    can read a process's command line);
 2. started by root, drops the capability bounding set, then to the payload's
    uid and gid (bwrap ran as root so that it could mount what root can read);
    checks that every re-mount inside a writable tree sits where it should;
 3. with egress, starts the bridge (``/run/corral/bridge.py``): listening on
    127.0.0.1 *before* the fork, so the payload's first request never races it;
    checks that it is the PID the seccomp filter protects, with one thread;
 4. forks; the child sets rlimits, applies Landlock, stacks the payload's own
    seccomp filter when the config has one (bwrap's filter already covers
    this whole process tree), moves the real stderr in place, closes every
    other descriptor and execs the payload;
 5. the parent reports "started" once the exec has succeeded, waits (serving
    the bridge meanwhile, and ending the sandbox if the launcher goes:
    :func:`supervise`), reports how the payload ended on the status
    descriptor, and exits the same way.

Its config is marshalled by the launcher, which runs the same interpreter.
A setup failure is reported as an ``error`` event and exit status 125, so
the launcher can tell it from the payload's own failures.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import signal
import sys

# Every import here is paid on every launch, inside the sandbox: no json (it pulls in
# re), no typing (TYPE_CHECKING is spelled out so that mypy still sees the names).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SETUP_FAILED = 125

# Landlock (include/uapi/linux/landlock.h)
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_ALL = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6
PR_SET_DUMPABLE = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

RLIMITS = {"nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE,
           "core": resource.RLIMIT_CORE, "cpu": resource.RLIMIT_CPU,
           "nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS}


class SetupError(Exception):
    """Something the policy requires could not be done; the payload must not start."""


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    abi = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                          ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def write_access(abi: int) -> int:
    """Every write-type filesystem right this ABI knows."""
    access = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_ALL
    if abi >= 2:
        access |= FS_REFER
    if abi >= 3:
        access |= FS_TRUNCATE
    return access


def apply_landlock(cfg: dict[str, Any]) -> int:
    """Allow writes only beneath ``cfg["writable"]``; returns the ABI used (0: skipped)."""
    abi = landlock_abi()
    need = int(cfg.get("min_abi", 1))
    if abi < need:
        if cfg.get("best_effort"):
            return 0
        raise SetupError(f"Landlock ABI {need} is required but the kernel offers {abi}")
    libc = _libc()
    handled = write_access(abi)
    attr = RulesetAttr(handled, 0, 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    if abi >= 6 and cfg.get("scope", True):
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise SetupError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        for path, rights in cfg["rules"]:
            _add_rule(libc, ruleset, path, int(rights) & handled)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise SetupError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there, nothing to allow
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            # Directory-only rights on a file are EINVAL; keep the file rights.
            rights &= FS_WRITE_FILE | FS_TRUNCATE
        rule = PathBeneathAttr(rights, fd)
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise SetupError(f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(program: bytes) -> None:
    """Stack a seccomp BPF program (compiled on the host) on this process and its children."""
    libc = _libc()
    code = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    one, mode = ctypes.c_ulong(1), ctypes.c_ulong(SECCOMP_MODE_FILTER)
    if (libc.prctl(PR_SET_NO_NEW_PRIVS, one, 0, 0, 0) != 0
            or libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(fprog), 0, 0) != 0):
        raise SetupError("cannot install the payload's seccomp filter: "
                         f"{os.strerror(ctypes.get_errno())}")


def drop_to(uid: int, gid: int) -> None:
    """Started by root without a user namespace: become uid/gid with no capabilities."""
    libc = _libc()
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SetupError(f"could not drop capability {cap} from the bounding set")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise SetupError(f"could not become uid {uid}, gid {gid}")
    # setresuid cleared the permitted and effective sets; bwrap's --cap-add also left
    # these capabilities inheritable.  Harmless under no_new_privs, but nothing is
    # left to chance: empty every set (lowering needs no privilege).
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise SetupError(f"capset: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/status") as f:
        sets = {k: int(v, 16) for k, v in (line.split(":") for line in f
                                           if line.startswith(("CapInh", "CapEff", "CapPrm")))}
    if any(sets.values()):
        raise SetupError("capabilities survived the drop to an unprivileged uid")


def _mount_points() -> set[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo (octal escapes undone)."""
    points = set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split(b" ")[4]
            points.add(field.decode("unicode_escape").encode("latin-1").decode(
                errors="surrogateescape"))
    return points


def check_mounts(expected: list[list[Any]]) -> None:
    """Every re-mount inside a writable tree landed exactly where it should.

    bwrap 0.8 resolves destinations through symlinks while setting up; another
    sandbox working in the same project could swap a folder for a link at that
    moment, and the mount would land elsewhere.  Checked here, from inside,
    before anything of the payload runs.
    """
    if not expected:
        return
    points = _mount_points()
    for path, action, dev, ino in expected:
        try:
            st = os.lstat(path)
        except OSError as e:
            raise SetupError(f"{path} is not in place inside the sandbox ({e.strerror})") from None
        same = (st.st_dev, st.st_ino) == (dev, ino)
        if path not in points or same != (action != "hide"):
            raise SetupError(f"{path} was not re-mounted where it belongs: something changed "
                             "the project while the sandbox was being set up")


def check_alone(expected: int | None) -> None:
    """This process is PID ``expected`` of the sandbox and has one thread.

    The seccomp filter lets the payload change limits and scheduling of any pid or
    thread id but bwrap's PID 1 and this PID (corral.syscalls.CORRAL_PIDS): the kernel
    checks only the uid, and a thread of ours under another id would be reachable.
    """
    if expected is None:
        return
    threads = len(os.listdir("/proc/self/task"))
    if os.getpid() != expected or threads != 1:
        raise SetupError(f"corral's init is PID {os.getpid()} with {threads} thread(s), not "
                         f"PID {expected} with one; the seccomp filter keeps the payload away "
                         "from that PID only, so it could change the init's limits; report "
                         "this with 'bwrap --version', or pass --allow no-seccomp")


def prefer_oom_kill() -> None:
    """Make the payload, not the init, the first to go when memory runs out.

    The init must survive to report how the run ended.  Raising one's own score
    needs no privilege, but /proc/self is root's while we are not dumpable: be
    dumpable for the write (exec resets it anyway).
    """
    _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError as e:
        raise SetupError(f"cannot set the payload's oom_score_adj: {e.strerror}") from None


def set_rlimits(limits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in limits.items():
        resource.setrlimit(RLIMITS[name], (soft, hard))


def take_terminal(fd: int) -> None:
    """In the payload, before exec: a session of its own, with corral's pty (``fd``) as its
    controlling terminal, so keys such as ^C and window resizes reach it the usual way."""
    import fcntl
    import termios

    os.setsid()
    try:
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
    except OSError as e:
        raise SetupError(f"cannot take corral's terminal: {e.strerror}") from None


def exec_payload(cfg: dict[str, Any], argv: list[str], report_w: int) -> None:
    """In the forked child: confine, then exec.  Never returns."""
    try:
        # Into the run's payload cgroups (its CPU cap) before anything of the payload runs;
        # the init stays out of the cap (corral.limits.PAYLOAD_ONLY; init.c says why).
        for fd in cfg.get("payload_cgroups", ()):
            try:
                os.write(int(fd), b"0")
            except OSError as e:
                raise SetupError(f"cannot enter the run's payload cgroup: {e.strerror}") \
                    from None
        # Then: dumpable again (the fork inherited the init's "not dumpable"), so that a
        # plain user's disk watcher can read this process's descriptors from the start.
        prefer_oom_kill()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if cfg.get("tty") is not None:
            take_terminal(int(cfg["tty"]))
        os.umask(0o022)
        os.chdir(cfg.get("cwd", "/"))
        set_rlimits(cfg.get("rlimits", {}))
        if cfg.get("landlock") is not None:
            apply_landlock(cfg["landlock"])
        if cfg.get("payload_seccomp"):
            install_filter(bytes.fromhex(cfg["payload_seccomp"]))
        stderr_fd = cfg.get("stderr_fd")
        if stderr_fd is not None:
            os.dup2(stderr_fd, 2)
        os.closerange(3, report_w)
        os.closerange(report_w + 1, 1 << 20)
        # The payload's variables come in the config: bwrap gave this process none (its own
        # interpreter and C library obey LD_PRELOAD and the like; corral.bwrap.init_environment).
        os.execve(argv[0], argv, dict(cfg.get("env", ())))
    except SetupError as e:
        message = str(e)
    except OSError as e:
        message = f"cannot execute {argv[0]}: {e.strerror}"
    except BaseException as e:
        message = f"{type(e).__name__}: {e}"
    os.write(report_w, message.encode(errors="replace")[:4000])
    os._exit(SETUP_FAILED)


def start_bridge(cfg: dict[str, Any]) -> Any:
    """The egress bridge, listening, or None without egress (see corral/egress/bridge.py)."""
    spec = cfg.get("egress")
    if spec is None:
        return None
    scope: dict[str, Any] = {"__name__": "corral_bridge"}
    with open(spec["path"], "rb") as f:
        exec(compile(f.read(), spec["path"], "exec"), scope)
    return scope["Bridge"](spec)


class Reporter:
    """JSON lines to the launcher's status descriptor."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.gone = False  # a report failed: the launcher is gone

    def send(self, **event: str | int) -> None:
        if self.fd is None:
            return
        line = ", ".join(f'"{k}": {_json_value(v)}' for k, v in event.items())
        try:
            os.write(self.fd, ("{" + line + "}\n").encode())
        except OSError:
            self.fd, self.gone = None, True  # the launcher is gone: supervise() ends us


def _json_value(value: str | int) -> str:
    """A JSON number or string, without importing json."""
    if isinstance(value, int):
        return str(value)
    escaped = "".join(c if c >= " " and c not in '"\\' else f"\\u{ord(c):04x}" for c in value)
    return f'"{escaped}"'


def end_sandbox(payload: int | None) -> None:
    """SIGKILL every process of this sandbox: kill -1 reaches the whole PID namespace but
    PID 1, bwrap's, which exits with us.  Only where this process is PID 2 of a namespace
    whose PID 1 is its parent, as bwrap starts it: run anywhere else (the tests run the
    init on the host), kill -1 would reach every process of its uid, so only ``payload``
    (when given) is killed."""
    target = -1 if os.getpid() == 2 and os.getppid() == 1 else payload
    if target is None:
        return
    try:  # noqa: SIM105 (no contextlib: every import here is paid on every launch)
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass  # nothing was left


def supervise(pid: int, report: Reporter, launcher: int | None, bridge: Any) -> int:
    """Wait for the payload (serving the bridge meanwhile); its wait status.

    The launcher is watched too, through ``launcher``, a pidfd of its process readable once
    it has exited, SIGKILLed or crashed; a status report that failed says the same.  corral
    does not use bwrap's --die-with-parent where the payload cannot stop the init
    (:func:`corral.resolve.init_shielded`), which leaves bwrap's sandbox child blocked for
    ever when the launcher dies while bwrap sets up, and follows the launcher's thread, not
    its process.  Then every process of the sandbox is killed (:func:`end_sandbox`).
    init_bridge.c does the same for the compiled init."""
    if report.gone:
        end_sandbox(pid)
        return os.waitpid(pid, 0)[1]
    if bridge is not None:
        status = bridge.serve(pid, launcher)
        if status is None:  # the launcher is gone
            end_sandbox(pid)
            return os.waitpid(pid, 0)[1]
        return int(status)
    if launcher is None:  # no launcher descriptor in the config: nobody to watch
        return os.waitpid(pid, 0)[1]
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(launcher, select.POLLIN)
    try:
        if any(fd == launcher for fd, _ in poller.poll()):
            end_sandbox(pid)
    finally:
        os.close(pidfd)
    return os.waitpid(pid, 0)[1]


def run(config_fd: int, argv: list[str]) -> int:
    with os.fdopen(config_fd, "rb") as f:
        cfg = marshal.loads(f.read())  # written by the launcher's own Python version
    report = Reporter(cfg.get("status_fd"))
    try:
        if cfg.get("uid") is not None and os.getuid() == 0:
            drop_to(int(cfg["uid"]), int(cfg["gid"]))
        check_mounts(cfg.get("expect_mounts", []))
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the payload may not read our fds
        bridge = start_bridge(cfg)
        check_alone(cfg.get("pid"))
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
    except (SetupError, OSError) as e:
        report.send(event="error", message=str(e))
        return SETUP_FAILED
    if pid == 0:
        os.close(report_r)
        exec_payload(cfg, argv, report_w)
    os.close(report_w)
    failure = os.read(report_r, 4096)
    os.close(report_r)
    if failure:
        os.waitpid(pid, 0)
        report.send(event="error", message=failure.decode(errors="replace"))
        return SETUP_FAILED
    report.send(event="started", pid=pid)
    status = supervise(pid, report, cfg.get("launcher_fd"), bridge)
    # What the payload left (a daemon, a fork bomb's rest) ends with it: bwrap's PID 1 waits
    # for every process of the namespace, and without --die-with-parent nothing else ends
    # them once bwrap's outer process has reported.
    end_sandbox(None)
    if os.WIFSIGNALED(status):
        report.send(event="signaled", signal=os.WTERMSIG(status))
        return 128 + os.WTERMSIG(status)
    report.send(event="exited", code=os.WEXITSTATUS(status))
    return os.WEXITSTATUS(status)


def main() -> None:
    if len(sys.argv) < 3:
        sys.stderr.write("corral init: usage: init.py CONFIG_FD ARGV...\n")
        sys.exit(SETUP_FAILED)
    sys.exit(run(int(sys.argv[1]), sys.argv[2:]))


if __name__ == "__main__":
    main()
