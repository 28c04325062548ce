"""Seccomp: the system-call filters behind every sandbox, compiled by libseccomp through ctypes.

corral compiles two classic-BPF programs on the host (no compiler at run time)
and caches each per process, so after the first run a launch only hands over
bytes:

* the **sandbox filter**, given to bwrap with ``--seccomp FD``.  It covers
  corral's init and everything the init starts, including the egress bridge
  that runs in the init's own process.  It is an allow-list: the calls, forms
  and reasons are the table in :mod:`corral.syscalls`; every other call fails
  with ``EPERM`` (the table's fallbacks with ``ENOSYS`` or ``EOPNOTSUPP``),
  and every call made through another ABI (i386 ``int 0x80`` and x32 on
  x86_64, arm32 on aarch64) fails with ``EPERM``, because the rules name
  native numbers;
* the **payload filter**, only when the policy forbids unix sockets
  (``unix_sockets = false``).  The init stacks it on the payload alone, after
  fork and just before exec, so the init's process (and the bridge in it)
  keeps ``AF_UNIX``.  It denies ``socket(AF_UNIX)`` and datagram socket
  pairs (:data:`corral.syscalls.UNIX_DENIALS`); the kernel applies the
  stricter answer of the two filters.

Supported native architectures: x86_64 and aarch64 (``clone`` takes its flags
in argument 0 on both, and calls newer than libseccomp 2.5 have the same
numbers on both).  Elsewhere compiling raises :class:`~corral.errors.HostError`.
"""

from __future__ import annotations

import ctypes
import errno
import os

from . import small
from .errors import HostError
from .record import NamedTuple

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:  # the tables cost ~2 ms to import: a start served by the cache skips them
    from typing import Any

    from .policy import Policy
    from .syscalls import Call, Form

__all__ = ["Programs", "Rule", "compile_filter", "compiled", "describe", "for_policy",
           "libseccomp_version", "payload_rules", "programs", "sandbox_rules", "summary"]

LIBRARY = "libseccomp.so.2"
MIN_VERSION = (2, 5, 0)  # binary-tree layout, clone3 and the new mount API by name

# libseccomp's ABI (seccomp.h, 2.5)
ACT_ALLOW = 0x7FFF0000
ACT_ERRNO = 0x00050000  # | errno
ATTR_ACT_BADARCH = 2
ATTR_CTL_OPTIMIZE = 8
OPTIMIZE_BINARY_TREE = 2
NR_SCMP_ERROR = -1
ARCHES = {0xC000003E: "x86_64", 0xC00000B7: "aarch64"}
EPERM = ACT_ERRNO | errno.EPERM
ERRNO_NAMES = {errno.ENOSYS: "ENOSYS", errno.EOPNOTSUPP: "EOPNOTSUPP"}  # errorcode says ENOTSUP


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


class Rule(NamedTuple):
    """One libseccomp rule: ``action`` for ``call`` when every comparison of ``when`` holds."""

    action: int
    call: str
    when: Form = ()
    number: int | None = None  # for calls libseccomp 2.5 does not know: the unified number


def _rules(calls: tuple[Call, ...], action: int) -> tuple[Rule, ...]:
    return tuple(Rule(action, c.name, form, c.number)
                 for c in calls for form in (c.forms or ((),)))


def sandbox_rules() -> tuple[Rule, ...]:
    """The sandbox filter's rules: every allowed form, then the fallbacks."""
    from . import syscalls

    allowed = (rule for group in syscalls.ALLOWED for rule in _rules(group.calls, ACT_ALLOW))
    fallbacks = (rule for f in syscalls.FALLBACKS
                 for rule in _rules(f.calls, ACT_ERRNO | f.error))
    return (*allowed, *fallbacks)


def payload_rules() -> tuple[Rule, ...]:
    """The payload filter's rules under ``unix_sockets = false``."""
    from . import syscalls

    return tuple(Rule(EPERM, d.call, d.when) for d in syscalls.UNIX_DENIALS)


class Programs(NamedTuple):
    """The compiled programs for one sandbox."""

    sandbox: bytes  # for bwrap --seccomp: corral's init and everything it starts
    payload: bytes | None  # stacked on the payload alone by the init; None: nothing to add
    init_pid: int  # the init's PID in the sandbox, which the sandbox filter protects


def _unavailable(what: str) -> HostError:
    return HostError(what, "corral filters system calls with libseccomp (an allow-list: "
                     "keyrings, ptrace, io_uring, new namespaces, foreign ABIs refused)",
                     "install it (Debian, Ubuntu: sudo apt-get install libseccomp2; Fedora: "
                     "sudo dnf install libseccomp), or pass --allow no-seccomp")


@small.cache
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
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_arch_remove.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
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
    # The native number: libseccomp translates it, by name, for any other target.
    nr = int(lib.seccomp_syscall_resolve_name(rule.call.encode()))
    if nr != NR_SCMP_ERROR:
        return nr  # below -1: a call this architecture lacks; libseccomp skips it
    if rule.number is None:
        raise HostError(f"libseccomp does not know the system call {rule.call}",
                        "corral's filter names it", "install libseccomp 2.5 or newer, or "
                        "pass --allow no-seccomp")
    return rule.number


def _add(lib: ctypes.CDLL, ctx: int, rule: Rule) -> None:
    cmps = (ArgCmp * len(rule.when))(*(ArgCmp(c.arg, c.op, c.datum_a, c.datum_b)
                                       for c in rule.when))
    rc = lib.seccomp_rule_add_array(ctx, rule.action, _number(lib, rule),
                                    len(rule.when), cmps)
    _check(rc, f"add a rule for {rule.call}")


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("corral-seccomp", os.MFD_CLOEXEC)
    try:
        _check(lib.seccomp_export_bpf(ctx, fd), "export the filter")
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _target(lib: ctypes.CDLL, arch: int | None) -> int:
    native = int(lib.seccomp_arch_native())
    target = native if arch is None else arch
    if target not in ARCHES:
        supported = ", ".join(ARCHES.values())
        raise HostError(f"corral's seccomp rules do not support this architecture "
                        f"(audit arch {target:#x})", f"they are written for {supported}",
                        "pass --allow no-seccomp to run without them")
    return target


@small.cache
def compile_filter(default: int, rules: tuple[Rule, ...], arch: int | None = None) -> bytes:
    """The BPF program taking ``default`` for every call no rule matches (cached).

    ``arch`` (an audit arch of :data:`ARCHES`) compiles for another architecture than
    this one, for tests: libseccomp translates rules between architectures by name, so
    rules for calls it does not know (those with a ``number``) are left out there.
    Calls made through any other ABI fail with EPERM.
    """
    lib = _library()
    target = _target(lib, arch)
    ctx = lib.seccomp_init(default)
    if not ctx:
        _check(-errno.ENOMEM, "create a filter")
    native = target == int(lib.seccomp_arch_native())
    try:
        if not native:
            _check(lib.seccomp_arch_add(ctx, target), "add the target architecture")
            _check(lib.seccomp_arch_remove(ctx, int(lib.seccomp_arch_native())),
                   "drop the native architecture")
        _check(lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, EPERM),
               "refuse foreign architectures")
        _check(lib.seccomp_attr_set(ctx, ATTR_CTL_OPTIMIZE, OPTIMIZE_BINARY_TREE),
               "lay the filter out as a binary tree")
        for rule in rules:
            if native or rule.number is None:
                _add(lib, ctx, rule)
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


@small.cache
def programs(unix_sockets: bool) -> Programs:
    """The programs for a policy that does (or does not) let the payload create unix sockets.

    From ``make setup``'s cache when it matches this code and this libseccomp in every
    respect (:mod:`corral.seccache`), else compiled.  Raises
    :class:`~corral.errors.HostError` when libseccomp cannot build them.
    """
    cached = _cached()
    if cached is not None:
        return cached._replace(payload=None) if unix_sockets else cached
    return compiled(unix_sockets)


def compiled(unix_sockets: bool) -> Programs:
    """The programs compiled through libseccomp now, whatever the cache holds."""
    from .syscalls import INIT_PID

    payload = None if unix_sockets else compile_filter(ACT_ALLOW, payload_rules())
    return Programs(compile_filter(EPERM, sandbox_rules()), payload, INIT_PID)


def _cached() -> Programs | None:
    """The cached programs for the loaded libseccomp; None to compile them."""
    from . import seccache

    lib = _library()  # the version check: a cache never stands in for a missing library
    return seccache.load(seccache.key(libseccomp_version(), int(lib.seccomp_arch_native())))


def for_policy(policy: Policy) -> Programs | None:
    """The programs ``policy`` needs; None only when they cannot be built and
    the policy allows running without seccomp (``--allow no-seccomp``)."""
    try:
        return programs(policy.unix_sockets)
    except HostError:
        if policy.allow.no_seccomp:
            return None
        raise


def describe(strict_profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the filters allow, counted from the table (for ``corral doctor``).

    ``strict_profiles`` are the profiles that set ``unix_sockets = false``.
    """
    from . import syscalls

    calls = [c for g in syscalls.ALLOWED for c in g.calls]
    return {"allowed": len(calls), "narrowed": sum(1 for c in calls if c.forms),
            "fallbacks": {ERRNO_NAMES[f.error]: sum(len(g.calls) for g in syscalls.FALLBACKS
                                                    if g.error == f.error)
                          for f in syscalls.FALLBACKS},
            "groups": {g.purpose: len(g.calls) for g in syscalls.ALLOWED},
            "payload_filter": {"when": "unix_sockets = false", "profiles": list(strict_profiles),
                               "denies": [d.label for d in syscalls.UNIX_DENIALS]}}


def summary() -> str:
    """What the sandbox filter allows, in one line (for ``corral doctor``)."""
    d = describe()
    return (f"allow-list of {d['allowed']} system calls ({d['narrowed']} only in some forms), "
            f"the rest refused ({_fallbacks(d)}, so that libraries fall back); "
            "foreign ABIs refused")


def _fallbacks(d: dict[str, Any]) -> str:
    return ", ".join(f"{n} with {name}" for name, n in d["fallbacks"].items())
