"""Seccomp: the system-call filter behind every sandbox, compiled by libseccomp through ctypes.

corral compiles two classic-BPF programs on the host (no compiler at run time)
and caches each per process, so after the first run a launch only hands over
bytes:

* the **sandbox filter**, given to bwrap with ``--seccomp FD``.  It covers
  corral's init and everything the init starts, including the egress bridge
  that runs in the init's own process;
* the **payload filter**, only when the policy forbids unix sockets.  The
  init stacks it on the payload alone, after fork and just before exec, so
  the init's process (and the bridge in it) keeps ``AF_UNIX``.

The default action is *allow*: the filter is a deny list of kernel surface
that everyday work (compilers, interpreters, package managers, git, test
suites) does not use.  Denied calls fail with ``EPERM``; ``clone3`` fails with
``ENOSYS``, so C libraries fall back on ``clone``, whose flags a filter can
read (``clone3`` keeps them in memory, out of seccomp's sight).

=====================  =========================================  ==================================
rule                   calls                                      why
=====================  =========================================  ==================================
foreign ABIs           every call through another ABI: i386       the rules below name native call
                       (``int 0x80``) and x32 (number bit 30) on  numbers; another ABI's numbering
                       x86_64, arm32 on aarch64 (EPERM)           would pass them unchecked
keyring                add_key, request_key, keyctl               keys are per uid and per session:
                                                                  the launcher's keyring is readable
                                                                  from inside otherwise (DESIGN 5)
other processes        ptrace, process_vm_readv,                  reading or steering another
                       process_vm_writev, pidfd_getfd, kcmp,      process: ptrace of bwrap's PID 1
                       process_madvise                            hangs the run (DESIGN 3);
                                                                  pidfd_getfd copies descriptors
                                                                  out; kcmp leaks kernel object
                                                                  identity
namespaces             unshare and clone with any CLONE_NEW*      a new user namespace hands back
                       flag, setns; clone3 (ENOSYS)               every capability inside it and
                                                                  much kernel surface; started by
                                                                  root, corral has no
                                                                  ``--disable-userns``, so this rule
                                                                  is what stops nested namespaces
mounts                 mount, umount2, mount_setattr, move_mount, the file view is fixed at setup;
                       open_tree, open_tree_attr, fsopen,         these need a capability the
                       fsconfig, fsmount, fspick, pivot_root,     payload must never have, so they
                       chroot                                     are a second wall
file handles           open_by_handle_at, name_to_handle_at       opening by handle walks past the
                                                                  mount view (the "shocker"
                                                                  container escape); the other
                                                                  call is its only producer
exploit primitives     bpf, perf_event_open, userfaultfd,         frequent roots of kernel
                       io_uring_setup, io_uring_enter,            exploits; userfaultfd makes races
                       io_uring_register, modify_ldt              reliable; io_uring performs I/O
                                                                  that seccomp never sees
host administration    kexec_load, kexec_file_load, init_module,  capability-gated; a second wall
                       finit_module, delete_module, reboot,       if a capability ever leaked in
                       swapon, swapoff, acct, quotactl,           (iopl and ioperm: raw port I/O;
                       quotactl_fd, syslog, settimeofday,         syslog: the kernel log)
                       clock_settime, iopl, ioperm
personality            personality with ADDR_NO_RANDOMIZE,        these switch off ASLR (or W^X)
                       ADDR_COMPAT_LAYOUT, READ_IMPLIES_EXEC,     for every program started next;
                       ADDR_LIMIT_32BIT, ADDR_LIMIT_3GB or        queries (0xffffffff) and plain
                       MMAP_PAGE_ZERO; any value with bit 31 set  personas keep working
                       except the query 0xffffffff
terminal injection     ioctl TIOCSTI and TIOCLINUX, the request   typing into the launcher's
                       compared on its low 32 bits                terminal (DESIGN 6); the kernel
                                                                  reads the request as 32 bits, so
                                                                  high bits must not dodge the rule
socket families        socket and socketpair with any family but  vsock reaches the hypervisor or
                       AF_UNIX, AF_INET, AF_INET6                 host (DESIGN 8); netlink, packet,
                                                                  alg, bluetooth... are kernel
                                                                  surface and can load modules
unix sockets           socket(AF_UNIX), payload filter only,      a unix socket reaches whatever
(policy)               when the policy sets                       socket file is visible, even on a
                       ``unix_sockets = false``; socketpair stays a read-only mount (and the egress
                       (its two ends reach only each other:       bridge's proxy socket); loopback
                       asyncio, multiprocessing need it)          TCP stays usable
=====================  =========================================  ==================================

Supported native architectures: x86_64 and aarch64 (``clone`` takes its flags
in argument 0 there, and the numbers of calls newer than libseccomp 2.5 are
the same).  Elsewhere compiling raises :class:`~corral.errors.HostError`.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from typing import NamedTuple

from .errors import HostError
from .policy import Policy

__all__ = [
    "SANDBOX_RULES",
    "UNIX_RULES",
    "Cmp",
    "Programs",
    "Rule",
    "compile_rules",
    "for_policy",
    "programs",
    "summary",
]

LIBRARY = "libseccomp.so.2"
MIN_VERSION = (2, 5, 0)  # binary-tree layout, clone3 and the new mount API by name

# libseccomp's ABI (seccomp.h, 2.5)
ACT_ALLOW = 0x7FFF0000
ACT_ERRNO = 0x00050000  # | errno
ATTR_ACT_BADARCH = 2
ATTR_CTL_OPTIMIZE = 8
OPTIMIZE_BINARY_TREE = 2
CMP_EQ, CMP_GT, CMP_MASKED_EQ = 4, 6, 7
NR_SCMP_ERROR = -1
ARCHES = {0xC000003E: "x86_64", 0xC00000B7: "aarch64"}

# Kernel constants
CLONE_NEW = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
             "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
             "NEWNET": 0x40000000}
CLONE_NEWTIME = 0x00000080  # unshare only: in clone()'s flags these bits are the exit signal
ASLR_WEAKENING = {"ADDR_NO_RANDOMIZE": 0x0040000, "MMAP_PAGE_ZERO": 0x0100000,
                  "ADDR_COMPAT_LAYOUT": 0x0200000, "READ_IMPLIES_EXEC": 0x0400000,
                  "ADDR_LIMIT_32BIT": 0x0800000, "ADDR_LIMIT_3GB": 0x8000000}
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
LOW32 = 0xFFFFFFFF


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


class Cmp(NamedTuple):
    """One comparison of a call's argument: libseccomp allows one per argument in a rule."""

    arg: int
    op: int
    datum_a: int
    datum_b: int = 0


def masked(arg: int, mask: int, value: int) -> Cmp:
    """(argument & mask) == value."""
    return Cmp(arg, CMP_MASKED_EQ, mask, value)


class Rule(NamedTuple):
    """Deny ``syscall`` (when every comparison holds): it fails with ``error``."""

    syscall: str
    when: tuple[Cmp, ...] = ()
    error: int = errno.EPERM
    number: int | None = None  # for calls libseccomp 2.5 does not know: the unified number


def _deny(*names: str) -> tuple[Rule, ...]:
    return tuple(Rule(name) for name in names)


def _namespace_rules() -> tuple[Rule, ...]:
    clone = tuple(Rule("clone", (masked(0, flag, flag),)) for flag in CLONE_NEW.values())
    unshare = tuple(Rule("unshare", (masked(0, flag, flag),))
                    for flag in (*CLONE_NEW.values(), CLONE_NEWTIME))
    return (*clone, *unshare, Rule("setns"), Rule("clone3", error=errno.ENOSYS))


def _personality_rules() -> tuple[Rule, ...]:
    # libseccomp takes one comparison per argument in a rule, and refuses an "allow"
    # rule beside an "allow" default, so "a weakening flag, unless the value is the query
    # 0xffffffff" is written as two families of single masked comparisons:
    #  1. a weakening bit set and bit 31 clear (no real persona uses bit 31);
    #  2. bit 31 set and any other bit clear.
    # The query is the one value with bit 31 set that no rule of family 2 matches.
    # The kernel reads the argument as 32 bits, so masks ignore the upper half.
    high = 1 << 31
    weak = tuple(Rule("personality", (masked(0, bit | high, bit),))
                 for bit in ASLR_WEAKENING.values())
    stray = tuple(Rule("personality", (masked(0, high | 1 << j, high),)) for j in range(31))
    return weak + stray


def _family_rules(call: str, allowed: tuple[int, ...]) -> tuple[Rule, ...]:
    # Compared on all 64 bits: a value with high bits set is denied by the GT rule, so
    # the kernel's 32-bit view of the family can never be an unlisted one.
    top = max(allowed)
    low = tuple(Rule(call, (Cmp(0, CMP_EQ, family),)) for family in range(top)
                if family not in allowed)
    return (*low, Rule(call, (Cmp(0, CMP_GT, top),)))


SANDBOX_RULES: tuple[Rule, ...] = (
    *_deny("add_key", "request_key", "keyctl"),
    *_deny("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
           "process_madvise"),
    *_namespace_rules(),
    *_deny("mount", "umount2", "mount_setattr", "move_mount", "open_tree", "fsopen",
           "fsconfig", "fsmount", "fspick", "pivot_root", "chroot"),
    Rule("open_tree_attr", number=467),  # Linux 6.15
    *_deny("open_by_handle_at", "name_to_handle_at"),
    *_deny("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
           "io_uring_register", "modify_ldt"),
    *_deny("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
           "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
           "settimeofday", "clock_settime", "iopl", "ioperm"),
    *_personality_rules(),
    Rule("ioctl", (masked(1, LOW32, TIOCSTI),)),
    Rule("ioctl", (masked(1, LOW32, TIOCLINUX),)),
    *_family_rules("socket", (AF_UNIX, AF_INET, AF_INET6)),
    *_family_rules("socketpair", (AF_UNIX, AF_INET, AF_INET6)),
)

# Stacked on the payload by the init when the policy forbids unix sockets.  Masked to
# 32 bits on its own, though the sandbox filter already denies families with high bits.
UNIX_RULES: tuple[Rule, ...] = (Rule("socket", (masked(0, LOW32, AF_UNIX),)),)


class Programs(NamedTuple):
    """The compiled programs for one sandbox."""

    sandbox: bytes  # for bwrap --seccomp: corral's init and everything it starts
    payload: bytes | None  # stacked on the payload alone by the init; None: nothing to add


def _unavailable(what: str) -> HostError:
    return HostError(what, "corral filters system calls with libseccomp (keyrings, ptrace, "
                     "io_uring, new namespaces, foreign ABIs)",
                     "install it (Debian, Ubuntu: sudo apt-get install libseccomp2; Fedora: "
                     "sudo dnf install libseccomp), or pass --allow no-seccomp")


@functools.cache
def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise _unavailable(f"{LIBRARY} cannot be loaded ({e})") from None
    lib.seccomp_version.restype = ctypes.POINTER(Version)
    v = lib.seccomp_version().contents
    if (v.major, v.minor, v.micro) < MIN_VERSION:
        raise _unavailable(f"libseccomp {v.major}.{v.minor}.{v.micro} is older than 2.5")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def libseccomp_version() -> str:
    """The loaded library's version; raises HostError when it cannot be loaded."""
    v = _library().seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise HostError(f"libseccomp could not {what}: {os.strerror(-rc)}",
                        "the sandbox's system-call filter cannot be built",
                        "report this with 'corral doctor' output, or pass --allow no-seccomp")


def _number(lib: ctypes.CDLL, rule: Rule) -> int:
    nr = int(lib.seccomp_syscall_resolve_name(rule.syscall.encode()))
    if nr != NR_SCMP_ERROR:
        return nr  # below -1: a call this architecture lacks; libseccomp skips it
    if rule.number is None:
        raise HostError(f"libseccomp does not know the system call {rule.syscall}",
                        "corral's filter names it", "install libseccomp 2.5 or newer, or "
                        "pass --allow no-seccomp")
    return rule.number


def _add(lib: ctypes.CDLL, ctx: int, rule: Rule) -> None:
    cmps = (ArgCmp * len(rule.when))(*(ArgCmp(c.arg, c.op, c.datum_a, c.datum_b)
                                       for c in rule.when))
    rc = lib.seccomp_rule_add_array(ctx, ACT_ERRNO | rule.error, _number(lib, rule),
                                    len(rule.when), cmps)
    _check(rc, f"add a rule for {rule.syscall}")


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("corral-seccomp", os.MFD_CLOEXEC)
    try:
        _check(lib.seccomp_export_bpf(ctx, fd), "export the filter")
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


@functools.cache
def compile_rules(rules: tuple[Rule, ...]) -> bytes:
    """The BPF program denying ``rules`` and allowing everything else (cached per rule set).

    Calls made through any ABI but the native one fail with EPERM.
    """
    lib = _library()
    arch = int(lib.seccomp_arch_native())
    if arch not in ARCHES:
        supported = ", ".join(ARCHES.values())
        raise HostError(f"corral's seccomp rules do not support this architecture "
                        f"(audit arch {arch:#x})", f"they are written for {supported}",
                        "pass --allow no-seccomp to run without them")
    ctx = lib.seccomp_init(ACT_ALLOW)
    if not ctx:
        _check(-errno.ENOMEM, "create a filter")
    try:
        _check(lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ERRNO | errno.EPERM),
               "refuse foreign architectures")
        _check(lib.seccomp_attr_set(ctx, ATTR_CTL_OPTIMIZE, OPTIMIZE_BINARY_TREE),
               "lay the filter out as a binary tree")
        for rule in rules:
            _add(lib, ctx, rule)
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


@functools.cache
def programs(unix_sockets: bool) -> Programs:
    """The programs for a policy that does (or does not) let the payload create unix sockets.

    Raises :class:`~corral.errors.HostError` when libseccomp cannot build them.
    """
    payload = None if unix_sockets else compile_rules(UNIX_RULES)
    return Programs(compile_rules(SANDBOX_RULES), payload)


def for_policy(policy: Policy) -> Programs | None:
    """The programs ``policy`` needs; None only when they cannot be built and
    the policy allows running without seccomp (``--allow no-seccomp``)."""
    try:
        return programs(policy.unix_sockets)
    except HostError:
        if policy.allow.no_seccomp:
            return None
        raise


def summary() -> str:
    """What the sandbox filter denies, in one line (for ``corral doctor``)."""
    calls = len({rule.syscall for rule in SANDBOX_RULES})
    return (f"{calls} system calls denied or narrowed ({len(SANDBOX_RULES)} rules), EPERM "
            "(clone3: ENOSYS); foreign ABIs refused")
