"""The system-call table: what the sandbox filter allows, in which forms, and why.

The sandbox filter (see :mod:`corral.seccomp`) is an **allow-list**.  Every
call below is allowed by name, resolved by libseccomp for the native
architecture (x86_64 or aarch64; a name the architecture lacks, such as
``open`` on aarch64, is skipped).  A call with *forms* is allowed only when
one of its forms holds: a form is a tuple of comparisons on the call's
arguments, all of which must hold.  Everything else fails with ``EPERM``,
including calls added to the kernel after this table was written; the calls
in :data:`FALLBACKS` fail with ``ENOSYS`` instead, because C libraries and
runtimes probe for them and fall back on an older call only on ``ENOSYS``.

Arguments the kernel reads as 32-bit ``int`` (flags, modes, pids, ioctl
requests) are compared on their low 32 bits, as the kernel reads them, so
that high bits can neither dodge a rule nor make a harmless value fail.

:data:`REFUSED` names the calls corral refuses on purpose, each with its
reason; they need no rule (the default refuses them) and are listed so that
tests and docs can hold the table to them.  :data:`UNIX_DENIALS` is the
payload filter's deny list under ``unix_sockets = false``.

Against the default profile container runtimes ship for a container without
capabilities (Docker's, moby/profiles seccomp/default.json), this table also
refuses ptrace and process_vm_*, fanotify_mark, memfd_secret, cachestat,
remap_file_pages, adjtimex and clock_adjtime, the 32-bit TLS calls,
process_mrelease, name_to_handle_at and openat2, Linux AIO, the newer mount,
LSM and xattr calls, uretprobe (which the kernel passes through anyway),
allocating fallocate modes, personality beyond three values, most of the 'T'
ioctl range, inotify watches for reads (IN_ACCESS), and limits and scheduling of
corral's own processes and of process groups and uids. It allows two things that
profile does not: get_mempolicy, set_mempolicy and mbind on the caller's own
memory (kept there for CAP_SYS_NICE; libnuma is built on them), and migrate_pages
and move_pages on the payload's own processes.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["ALLOWED", "CORRAL_PIDS", "FALLBACKS", "INIT_PID", "REFUSED", "UNIX_DENIALS", "Call",
           "Cmp", "Denial", "Group", "allowed_names"]

CMP_EQ, CMP_MASKED_EQ = 4, 7  # libseccomp's enum scmp_compare
LOW32 = 0xFFFFFFFF

# Kernel constants (include/uapi/linux/*.h; the same on x86_64 and aarch64)
CLONE_NEW = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
             "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
             "NEWNET": 0x40000000}
CLONE_NEWTIME = 0x00000080  # unshare only: in clone()'s flags these bits are the exit signal
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0  # the protocol argument of socket(AF_NETLINK, ...)
SOCK_DGRAM, SOCK_RAW = 2, 3  # AF_UNIX turns SOCK_RAW into SOCK_DGRAM (net/unix/af_unix.c)
SOCK_FLAGS = 0o2000000 | 0o4000  # SOCK_CLOEXEC | SOCK_NONBLOCK, or-ed into the type
S_ISUID, S_ISGID = 0o4000, 0o2000
O_CREAT, O_TMPFILE_BIT = 0o100, 0o20000000  # either makes open() read its mode argument
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_ZERO_RANGE = 0x08, 0x10
FALLOC_FL_UNSHARE_RANGE, FALLOC_FL_WRITE_ZEROES = 0x40, 0x80
# Modes that allocate space: plain (0), zeroing, unsharing, writing zeroes, each with or
# without KEEP_SIZE (WRITE_ZEROES takes none).
FALLOC_ALLOCATING = (0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE,
                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_UNSHARE_RANGE,
                     FALLOC_FL_UNSHARE_RANGE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_WRITE_ZEROES)
PER_LINUX, PER_LINUX32, PERSONALITY_QUERY = 0x0000, 0x0008, 0xFFFFFFFF
IN_ACCESS = 0x00000001  # inotify: the watched file was read
TTY_IOCTL_TYPE = 0x54  # 'T': the TC*/TIOC* requests, and the FIO* ones that share it

# The 'T' requests a program needs (traced from bash, less, vim, python's pty, node, tmux
# and git on a real terminal).  Every other 'T' request fails: TIOCSTI and TIOCLINUX type
# into a terminal, TIOCSETD kills it, TIOCCONS steals the console, TIOCVHANGUP hangs it
# up, TCXONC stops its output, TIOCEXCL locks it, and the serial, modem and tun/tap
# requests (TUNSETIFF is 'T' too) have no place in a sandbox.
TTY_REQUESTS = {
    "TCGETS": 0x5401, "TCSETS": 0x5402, "TCSETSW": 0x5403, "TCSETSF": 0x5404,
    "TCGETS2": 0x802C542A, "TCSETS2": 0x402C542B, "TCSETSW2": 0x402C542C,
    "TCSETSF2": 0x402C542D,  # termios2: newer C libraries use these for tcgetattr/tcsetattr
    "TCSBRK": 0x5409, "TCFLSH": 0x540B,  # tcdrain, tcflush
    "TIOCGWINSZ": 0x5413, "TIOCSWINSZ": 0x5414, "TIOCOUTQ": 0x5411, "FIONREAD": 0x541B,
    "TIOCSCTTY": 0x540E, "TIOCNOTTY": 0x5422, "TIOCGPGRP": 0x540F, "TIOCSPGRP": 0x5410,
    "TIOCGSID": 0x5429,  # job control: the kernel allows these on one's own terminal only
    "TIOCGPTN": 0x80045430, "TIOCSPTLCK": 0x40045431, "TIOCGPTPEER": 0x5441,  # openpty
    "FIONBIO": 0x5421, "FIOASYNC": 0x5452, "FIONCLEX": 0x5450, "FIOCLEX": 0x5451,
    "FIOQSIZE": 0x5460,  # descriptor requests for any file (libuv sets O_NONBLOCK this way)
}
DENIED_TTY_REQUESTS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C, "TIOCSETD": 0x5423,
                       "TIOCCONS": 0x541D, "TIOCVHANGUP": 0x5437, "TCXONC": 0x540A,
                       "TIOCEXCL": 0x540C, "TIOCSSERIAL": 0x541F, "TIOCMSET": 0x5418,
                       "TUNSETIFF": 0x400454CA}


class Cmp(NamedTuple):
    """One comparison of a call's argument (struct scmp_arg_cmp)."""

    arg: int
    op: int
    datum_a: int
    datum_b: int = 0


def masked(arg: int, mask: int, value: int) -> Cmp:
    """(argument & mask) == value."""
    return Cmp(arg, CMP_MASKED_EQ, mask, value)


def low32(arg: int, value: int) -> Cmp:
    """The argument, read as the kernel reads an int, equals ``value``."""
    return masked(arg, LOW32, value)


def clear(arg: int, bits: int) -> Cmp:
    """None of ``bits`` is set in the argument."""
    return masked(arg, bits, 0)


Form = tuple[Cmp, ...]


class Call(NamedTuple):
    """A call allowed in every form (``forms`` empty) or only in one of ``forms``."""

    name: str
    forms: tuple[Form, ...] = ()
    number: int | None = None  # the unified number, for calls libseccomp 2.5 does not know


class Group(NamedTuple):
    """Calls allowed for one purpose, with the reason they are safe to allow."""

    purpose: str
    why: str
    calls: tuple[Call, ...]


def _calls(*names: str) -> tuple[Call, ...]:
    return tuple(Call(name) for name in names)


def _each(arg: int, values: tuple[int, ...]) -> tuple[Form, ...]:
    return tuple((low32(arg, v),) for v in values)


def field_not_in(arg: int, shift: int, width: int, excluded: frozenset[int]
                 ) -> Iterator[Form]:
    """Forms, one of which holds exactly when the ``width``-bit field at bit ``shift`` of
    the argument is none of ``excluded``.

    libseccomp has no "not equal under a mask" and takes one comparison per argument
    in a rule, so the complement is written as masked comparisons on prefixes: walk the
    binary trie of the excluded values and emit every sibling branch that holds none.
    """
    def walk(prefix: int, depth: int) -> Iterator[Form]:
        under = [v for v in excluded if v >> (width - depth) == prefix]
        if not under:
            mask = ((1 << depth) - 1) << (width - depth)
            yield (masked(arg, mask << shift, (prefix << (width - depth)) << shift),)
        elif depth < width:
            yield from walk(prefix << 1, depth + 1)
            yield from walk(prefix << 1 | 1, depth + 1)
    yield from walk(0, 0)


def _no_setid(arg: int) -> tuple[Form, ...]:
    return ((clear(arg, S_ISUID | S_ISGID),),)


def _opens(flags: int, mode: int) -> tuple[Form, ...]:
    # The mode counts only when the call creates: allowed when it does not, or when the
    # mode asks for neither set-id bit (the kernel honours both for new files).
    return ((clear(flags, O_CREAT | O_TMPFILE_BIT),), (clear(mode, S_ISUID | S_ISGID),))


# The sandbox's PID namespace holds bwrap's PID 1, corral's init (its one child, PID 2,
# single-threaded: the init checks both before it forks) and the payload.  Any other pid
# or thread id there is the payload's own, and the namespace shows nothing else; 0 names
# the caller.  These forms hold when the pid argument, read as the kernel reads a pid_t
# (low 32 bits), names neither of corral's processes.
INIT_PID = 2
CORRAL_PIDS = frozenset({1, INIT_PID})


def not_corral(arg: int) -> tuple[Form, ...]:
    return tuple(field_not_in(arg, 0, 32, CORRAL_PIDS))


def _for_process(which: int) -> tuple[Form, ...]:
    """setpriority, ioprio_set: ``which`` names one process, and it is not corral's."""
    return tuple((low32(0, which), *form) for form in not_corral(1))


PAYLOAD_PIDS = not_corral(0)

FILES = Group("files", "reading and writing what the mounts and Landlock let the payload "
              "reach; the kernel's own permission checks apply", (
    *_calls("read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
            "preadv2", "pwritev2", "lseek", "close", "close_range", "dup", "dup2", "dup3",
            "fcntl", "flock", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
            "fadvise64", "readahead", "sendfile", "copy_file_range", "splice", "tee",
            "vmsplice", "truncate", "ftruncate", "getdents", "getdents64", "stat", "fstat",
            "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat",
            "faccessat2", "readlink", "readlinkat", "getcwd", "chdir", "fchdir", "umask",
            "utime", "utimes", "futimesat", "utimensat", "mkdir", "mkdirat", "rmdir",
            "rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat",
            "symlink", "symlinkat", "chown", "fchown", "lchown", "fchownat", "setxattr",
            "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
            "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
            "inotify_init", "inotify_init1", "inotify_rm_watch"),
))

WATCHES = Group("watching files", "file watchers ask for changes, opens and closes; a watch "
                "for reads (IN_ACCESS) is refused, because the nodes in /dev are the host's "
                "own: on /dev/tty it times every key a host program reads from its terminal "
                "in raw mode (less, fzf, pinentry)", (
    Call("inotify_add_watch", ((clear(2, IN_ACCESS),),)),
))

FILE_FORMS = Group("file modes and space", "a set-uid or set-gid bit left in a writable "
                   "tree runs with its owner's rights on the host later (mkdir ignores "
                   "both bits, so it needs no rule); fallocate only frees space here "
                   "(see FALLBACKS for the modes that allocate it)", (
    Call("open", _opens(1, 2)), Call("openat", _opens(2, 3)), Call("creat", _no_setid(1)),
    Call("chmod", _no_setid(1)), Call("fchmod", _no_setid(1)),
    Call("fchmodat", _no_setid(2)), Call("fchmodat2", _no_setid(2)),
    Call("mknod", _no_setid(1)), Call("mknodat", _no_setid(2)),
    Call("fallocate", _each(1, (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                FALLOC_FL_COLLAPSE_RANGE))),
))

TERMINALS = Group("terminal and descriptor requests", "ioctl requests outside the 'T' "
                  "range act on the payload's own files and devices; in it, only the "
                  "requests a program needs (termios, window size, job control, openpty, "
                  "FIO*), so that no request types into, kills or steals a terminal", (
    Call("ioctl", (*field_not_in(1, 8, 8, frozenset({TTY_IOCTL_TYPE})),
                   *_each(1, tuple(TTY_REQUESTS.values())))),
))

MEMORY = Group("memory", "the caller's own address space; NUMA placement of the payload's "
               "own pages only (migrate_pages and move_pages name a pid: not corral's)", (
    *_calls("brk", "mmap", "munmap", "mremap", "mprotect", "pkey_mprotect", "pkey_alloc",
            "pkey_free", "msync", "mincore", "madvise", "mlock", "mlock2", "munlock",
            "mlockall", "munlockall", "membarrier", "memfd_create", "map_shadow_stack",
            "get_mempolicy", "set_mempolicy", "mbind"),
    Call("mseal", number=462),  # Linux 6.10: only takes powers away from the caller
    Call("migrate_pages", PAYLOAD_PIDS), Call("move_pages", PAYLOAD_PIDS),
))

PROCESSES = Group("processes and threads", "fork, exec and wait inside the sandbox's own "
                  "PID namespace; no new namespaces (clone and unshare without CLONE_NEW*); "
                  "signals to processes outside the payload's Landlock domain are refused "
                  "by Landlock's scope (ABI 6)", (
    Call("clone", ((clear(0, sum(CLONE_NEW.values())),),)),
    Call("unshare", ((clear(0, sum(CLONE_NEW.values()) | CLONE_NEWTIME),),)),
    *_calls("fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
            "getpid", "getppid", "gettid", "getpgid", "getpgrp", "setpgid", "getsid",
            "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq",
            "futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
            "restart_syscall", "arch_prctl", "prctl", "pidfd_open", "pidfd_send_signal",
            "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "capget",
            "capset", "uname", "sysinfo", "getrusage", "times", "getcpu", "getrandom"),
))

SCHEDULING = Group("limits and scheduling of the payload's own processes", "the kernel "
                   "lets any process change these for every process of the same uid, "
                   "corral's init included (RLIMIT_CPU of one second kills it): the pid (or "
                   "who) argument may name any process or thread but bwrap's PID 1 and the "
                   "init; a process group or a uid (both include the init) never; "
                   "reading them stays open", (
    *_calls("getrlimit", "setrlimit", "getpriority", "ioprio_get", "sched_yield",
            "sched_getaffinity", "sched_getparam", "sched_getscheduler", "sched_getattr",
            "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval"),
    *(Call(name, PAYLOAD_PIDS) for name in ("prlimit64", "sched_setscheduler",
                                             "sched_setparam", "sched_setaffinity",
                                             "sched_setattr")),
    Call("setpriority", _for_process(PRIO_PROCESS)),
    Call("ioprio_set", _for_process(IOPRIO_WHO_PROCESS)),
    Call("personality", _each(0, (PER_LINUX, PER_LINUX32, PERSONALITY_QUERY))),
))

IDENTITY = Group("identity", "without capabilities the kernel allows only the transitions "
                 "a process may make to itself (programs drop privileges this way)", _calls(
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
    "setfsgid", "setgroups"))

TIME = Group("signals and time", "the caller's own signal handling, timers and clocks "
             "(setting the clock stays refused)", _calls(
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigsuspend", "sigaltstack", "pause", "alarm", "nanosleep", "clock_nanosleep",
    "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime",
    "timerfd_gettime", "signalfd", "signalfd4", "gettimeofday", "time", "clock_gettime",
    "clock_getres"))

WAITING = Group("waiting on descriptors", "event loops of every runtime", _calls(
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "pipe", "pipe2"))

SOCKETS = Group("sockets", "unix, IPv4 and IPv6 (vsock reaches the host, packet sockets "
                "are kernel surface); of netlink only the routing protocol, which the C "
                "library's getifaddrs and if_nameindex use, and which without CAP_NET_ADMIN "
                "only reads the sandbox's own namespace (other protocols carry the host's "
                "device events, audit, netfilter); the network namespace has loopback only; "
                "socketpair exists for unix sockets only", (
    Call("socket", (*_each(0, (AF_UNIX, AF_INET, AF_INET6)),
                    (low32(0, AF_NETLINK), low32(2, NETLINK_ROUTE)))),
    Call("socketpair", _each(0, (AF_UNIX,))),
    *_calls("connect", "accept", "accept4", "bind", "listen", "getsockname", "getpeername",
            "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown",
            "setsockopt", "getsockopt"),
))

IPC = Group("System V and POSIX IPC", "the sandbox has an IPC namespace of its own "
            "(PostgreSQL's semaphores, shared memory)", _calls(
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr"))

SELF_CONFINEMENT = Group("confining oneself further", "a program may add filters and "
                         "Landlock rules of its own; it can only lose powers", _calls(
    "seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"))

ALLOWED: tuple[Group, ...] = (FILES, WATCHES, FILE_FORMS, TERMINALS, MEMORY, PROCESSES,
                              SCHEDULING, IDENTITY, TIME, WAITING, SOCKETS, IPC,
                              SELF_CONFINEMENT)


class Fallback(NamedTuple):
    """Calls (or forms) refused with what a kernel or file system without them says, so that
    callers fall back: ENOSYS for a missing call, EOPNOTSUPP for an unsupported mode."""

    why: str
    calls: tuple[Call, ...]
    error: int = errno.ENOSYS


FALLBACKS: tuple[Fallback, ...] = (
    Fallback("clone3 and openat2 keep their flags and mode in memory, out of seccomp's "
             "sight (a new namespace, a set-uid file); the C library falls back on clone "
             "and openat, whose arguments the rules read", _calls("clone3", "openat2")),
    Fallback("Linux AIO contexts come from one table for the whole host (fs.aio-max-nr) "
             "that a single run could fill; programs fall back on threads",
             _calls("io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents",
                    "io_pgetevents")),
    Fallback("newer mount, security-module and xattr interfaces: libmount, libselinux "
             "and the C library fall back on /proc and the older calls", (
                 Call("statmount", number=457), Call("listmount", number=458),
                 Call("lsm_get_self_attr", number=459), Call("lsm_set_self_attr", number=460),
                 Call("lsm_list_modules", number=461), Call("setxattrat", number=463),
                 Call("getxattrat", number=464), Call("listxattrat", number=465),
                 Call("removexattrat", number=466), Call("file_getattr", number=468),
                 Call("file_setattr", number=469))),
    Fallback("fallocate modes that allocate: one call allocates as much as RLIMIT_FSIZE lets "
             "one file have, in microseconds, file after file, far faster than the disk "
             "limit's checks (765 MiB in 2 ms under --disk 16M); EOPNOTSUPP is what a file "
             "system without fallocate says, and the C library's posix_fallocate then writes "
             "the blocks, as fast as any write",
             (Call("fallocate", _each(1, FALLOC_ALLOCATING)),), errno.EOPNOTSUPP),
)

# Refused with EPERM, on purpose.  No rule is needed (the default refuses them); tests
# check that none of them slipped into ALLOWED and that each fails inside.
REFUSED: dict[str, tuple[str, ...]] = {
    "keys are per uid and per session: the launcher's keyring would be readable":
        ("add_key", "request_key", "keyctl"),
    "reading or steering another process (ptrace of bwrap's PID 1 hangs the run)":
        ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
         "process_madvise", "process_mrelease"),
    "namespaces: a new user namespace hands back every capability inside it":
        ("setns",),
    "mounts and file handles: the file view is fixed at setup; opening by handle walks "
    "past it": ("mount", "umount2", "mount_setattr", "move_mount", "open_tree", "fsopen",
                "fsconfig", "fsmount", "fspick", "pivot_root", "chroot",
                "open_by_handle_at", "name_to_handle_at"),
    "frequent roots of kernel exploits; io_uring performs I/O that seccomp never sees":
        ("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
         "io_uring_register", "modify_ldt"),
    "fanotify works unprivileged: a mark on a shared folder such as /usr/bin watches the "
    "host's opens and execs": ("fanotify_init", "fanotify_mark"),
    "host administration, capability-gated (a second wall)":
        ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
         "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
         "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
         "sethostname", "setdomainname", "vhangup", "lookup_dcookie", "nfsservctl"),
    "memory the kernel hides from itself, or another node's: nothing everyday needs them":
        ("memfd_secret", "set_mempolicy_home_node", "cachestat", "remap_file_pages"),
    "obsolete calls that still reach the kernel, and the 32-bit TLS entries":
        ("uselib", "ustat", "sysfs", "_sysctl", "create_module", "get_kernel_syms",
         "query_module", "getpmsg", "putpmsg", "afs_syscall", "tuxcall", "security",
         "vserver", "epoll_ctl_old", "epoll_wait_old", "set_thread_area", "get_thread_area"),
}

# The payload filter under ``unix_sockets = false`` (a deny list stacked on the payload
# alone: the init's process keeps AF_UNIX for the egress bridge).  A datagram pair's end
# can sendto() any visible unix datagram socket, so only stream and seqpacket pairs stay.
class Denial(NamedTuple):
    """One form of a call the payload filter denies, and how doctor names it."""

    label: str
    call: str
    when: Form


UNIX_DENIALS: tuple[Denial, ...] = (
    Denial("socket(AF_UNIX)", "socket", (low32(0, AF_UNIX),)),
    *(Denial(f"socketpair(AF_UNIX, {label})", "socketpair",
             (low32(0, AF_UNIX), masked(1, LOW32 & ~SOCK_FLAGS, kind)))
      for label, kind in (("SOCK_DGRAM", SOCK_DGRAM), ("SOCK_RAW", SOCK_RAW))),
)


def allowed_names() -> set[str]:
    """Every call the table allows in some form."""
    return {call.name for group in ALLOWED for call in group.calls}
