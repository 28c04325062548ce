"""The compiled seccomp programs, evaluated instruction by instruction (no kernel involved).

A small classic-BPF interpreter runs libseccomp's output on made-up
``seccomp_data`` records, so every rule is checked for exactly what it
allows and what it refuses: each call of the table, every number it does
not name, each argument form, high bits in 64-bit registers, foreign ABIs,
and the aarch64 program too.  The real kernel checks are in
``test_kernel_layers.py`` and ``test_seccomp_sandbox.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import need
from corral import seccomp, syscalls
from corral.errors import HostError
from corral.policy import Allow, Policy
from corral.record import replace
from corral.syscalls import CLONE_NEW, CLONE_NEWTIME, TTY_REQUESTS

ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
EOPNOTSUPP = 0x00050000 | errno.EOPNOTSUPP
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003
X32_BIT = 0x40000000
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
U32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
HIGH = st.integers(min_value=0, max_value=(1 << 32) - 1).map(lambda h: h << 32)
SETID = 0o6000


def run_bpf(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = X86_64) -> int:
    """The action ``program`` returns for one system call (classic BPF, seccomp_data input)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    a = x = pc = 0
    mem = [0] * 16
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            a = struct.unpack_from("<I", data, k)[0]
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset
            taken = {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if taken else jf
        elif code == 0x05:  # ja
            pc += k
        elif code == 0x54:  # and #k
            a &= k
        elif code == 0x06:  # ret #k
            return k
        elif code == 0x00:  # ld #k
            a = k
        elif code == 0x02:  # st M[k]
            mem[k] = a
        elif code == 0x60:  # ld M[k]
            a = mem[k]
        elif code in (0x07, 0x87):  # tax, txa
            a, x = (a, a) if code == 0x07 else (x, x)
        else:
            raise AssertionError(f"BPF opcode {code:#x} at {pc - 1} is not modelled here")


def _native() -> None:
    need(os.uname().machine == "x86_64", "the numbers in these tests are x86_64's")


@pytest.fixture(scope="module")
def sandbox() -> bytes:
    _native()
    return seccomp.programs(True).sandbox


@pytest.fixture(scope="module")
def payload() -> bytes:
    _native()
    program = seccomp.programs(False).payload
    assert program is not None
    return program


def nr(name: str) -> int:
    """The x86_64 number of ``name`` (libseccomp's table, or the table's own number)."""
    lib = seccomp._library()
    number = int(lib.seccomp_syscall_resolve_name(name.encode()))
    if number >= 0:
        return number
    explicit = {c.name: c.number for g in syscalls.ALLOWED for c in g.calls}
    explicit |= {c.name: c.number for f in syscalls.FALLBACKS for c in f.calls}
    found = explicit.get(name)
    assert found is not None, f"{name} has no number here"
    return found


def known_x86_64() -> dict[int, str]:
    """Every x86_64 call libseccomp knows, by number."""
    lib = seccomp._library()
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    out = {}
    for n in range(1024):
        name = lib.seccomp_syscall_resolve_num_arch(X86_64, n)
        if name:
            out[n] = ctypes.string_at(name).decode()
    return out


UNCONDITIONAL = sorted(c.name for g in syscalls.ALLOWED for c in g.calls if not c.forms)
NARROWED = sorted(c.name for g in syscalls.ALLOWED for c in g.calls if c.forms)
FALLBACK = sorted(c.name for f in syscalls.FALLBACKS for c in f.calls if not c.forms)
FALLBACK_FORMS = sorted(c.name for f in syscalls.FALLBACKS for c in f.calls if c.forms)
REFUSED = sorted(name for names in syscalls.REFUSED.values() for name in names)


# --- the table ------------------------------------------------------------------------------

def test_every_call_is_decided_once_with_a_reason() -> None:
    _native()
    decided = [*UNCONDITIONAL, *NARROWED, *FALLBACK, *REFUSED]
    assert len(decided) == len(set(decided)), "a call appears twice in the table"
    # A call may have some forms allowed and others refused with a fallback errno.
    assert set(FALLBACK_FORMS) <= set(NARROWED)
    # Every call this architecture has is allowed, narrowed, a fallback or refused on
    # purpose: nothing is refused only because nobody thought of it.
    undecided = set(known_x86_64().values()) - set(decided) - {"uretprobe"}
    assert not undecided, undecided
    assert all(g.why and g.purpose for g in syscalls.ALLOWED)
    assert all(f.why for f in syscalls.FALLBACKS) and all(syscalls.REFUSED)


def test_the_issues_calls_are_refused() -> None:
    listed = {"fanotify_init", "memfd_secret", "sysfs", "ustat", "vhangup", "clock_adjtime",
              "set_mempolicy_home_node", "uselib", "ptrace", "keyctl", "io_uring_setup",
              "userfaultfd", "bpf", "perf_event_open", "setns", "mount", "fsopen",
              "open_tree", "kcmp", "pidfd_getfd", "process_vm_readv"}
    assert listed <= set(REFUSED)
    assert {"statmount", "listmount", "lsm_get_self_attr", "lsm_set_self_attr",
            "lsm_list_modules", "clone3", "openat2"} <= set(FALLBACK)
    assert not (listed | set(FALLBACK)) & syscalls.allowed_names()


def test_programs_are_cached_and_fit(sandbox: bytes) -> None:
    assert seccomp.programs(False) is seccomp.programs(False)
    assert seccomp.programs(True).payload is None
    assert seccomp.programs(False).sandbox is seccomp.programs(True).sandbox
    assert 0 < len(sandbox) // 8 <= 4096  # BPF_MAXINSNS


# --- calls by number --------------------------------------------------------------------------

@pytest.mark.parametrize("name", UNCONDITIONAL)
def test_each_allowed_call_passes_whatever_its_arguments(sandbox: bytes, name: str) -> None:
    for args in ((), (1, 2, 3, 4, 5, 6), ((1 << 64) - 1,) * 6):
        assert run_bpf(sandbox, nr(name), args) == ALLOW, name


@pytest.mark.parametrize("name", [n for n in REFUSED if n != "_sysctl"])
def test_each_refused_call_gets_eperm(sandbox: bytes, name: str) -> None:
    assert run_bpf(sandbox, nr(name), (1, 2, 3)) == EPERM


@pytest.mark.parametrize("name", FALLBACK)
def test_each_fallback_gets_enosys(sandbox: bytes, name: str) -> None:
    assert run_bpf(sandbox, nr(name), (0, 88)) == ENOSYS


def test_every_number_nobody_named_is_refused(sandbox: bytes) -> None:
    named = {nr(n) for n in [*UNCONDITIONAL, *NARROWED, *FALLBACK]}
    for number in range(1024):  # calls of kernels yet to come, and holes in the table
        if number not in named:
            assert run_bpf(sandbox, number, (0, 0, 0)) == EPERM, number


@given(st.integers(min_value=0, max_value=600))
def test_foreign_abis_are_refused(sandbox: bytes, number: int) -> None:
    assert run_bpf(sandbox, number, arch=I386) == EPERM
    assert run_bpf(sandbox, number | X32_BIT) == EPERM
    assert run_bpf(sandbox, number, arch=AARCH64) == EPERM


# --- argument forms ---------------------------------------------------------------------------

@given(U64)
def test_namespace_flags_are_refused_in_clone_and_unshare(sandbox: bytes, flags: int) -> None:
    wanted = sum(CLONE_NEW.values())
    assert run_bpf(sandbox, nr("clone"), (flags,)) == (EPERM if flags & wanted else ALLOW)
    expect = EPERM if flags & (wanted | CLONE_NEWTIME) else ALLOW
    assert run_bpf(sandbox, nr("unshare"), (flags,)) == expect


@pytest.mark.parametrize("flag", sorted(CLONE_NEW.values()))
def test_every_namespace_flag_is_refused(sandbox: bytes, flag: int) -> None:
    for call in ("clone", "unshare"):
        assert run_bpf(sandbox, nr(call), (flag | 0x01200011 | 0xABCD << 32,)) == EPERM
    assert run_bpf(sandbox, nr("clone"), (0x01200011,)) == ALLOW  # what fork() passes
    assert run_bpf(sandbox, nr("clone"), (0x003D0F00,)) == ALLOW  # pthread_create()


@given(U64)
def test_personality_takes_the_common_values_only(sandbox: bytes, value: int) -> None:
    expect = ALLOW if value & 0xFFFFFFFF in (0, 8, 0xFFFFFFFF) else EPERM
    assert run_bpf(sandbox, nr("personality"), (value,)) == expect
    assert run_bpf(sandbox, nr("personality"), (0x0040000,)) == EPERM  # ADDR_NO_RANDOMIZE


@given(U32, HIGH)
def test_only_the_listed_tty_requests_pass(sandbox: bytes, request: int, high: int) -> None:
    in_range = request >> 8 & 0xFF == 0x54
    expect = EPERM if in_range and request not in TTY_REQUESTS.values() else ALLOW
    assert run_bpf(sandbox, nr("ioctl"), (0, request | high)) == expect


@pytest.mark.parametrize("code", [*syscalls.DENIED_TTY_REQUESTS.values(), 0x5400, 0x54FF])
def test_named_tty_requests_are_refused_whatever_the_high_bits(sandbox: bytes,
                                                             code: int) -> None:
    for high in (0, 0xDEAD << 32, 0xFFFFFFFF << 32):
        assert run_bpf(sandbox, nr("ioctl"), (0, code | high)) == EPERM


@pytest.mark.parametrize("code", [*TTY_REQUESTS.values(), 0x5302, 0x40049409, 0x8912])
def test_needed_requests_pass(sandbox: bytes, code: int) -> None:
    # 'T' requests on the list, a cdrom request, FICLONE, SIOCGIFCONF: all through
    assert run_bpf(sandbox, nr("ioctl"), (1, code | 0xFF << 40)) == ALLOW


@given(U64, U64)
def test_only_unix_and_inet_sockets_and_netlink_routing(sandbox: bytes, family: int,
                                                        protocol: int) -> None:
    low = family & 0xFFFFFFFF
    assert run_bpf(sandbox, nr("socket"), (family, 1, 0)) == (
        ALLOW if low in (1, 2, 10, 16) else EPERM)
    # AF_NETLINK: NETLINK_ROUTE (0) only; uevents, audit, sock_diag, netfilter refused
    routing = protocol & 0xFFFFFFFF == 0
    assert run_bpf(sandbox, nr("socket"), (16 | family >> 32 << 32, 3, protocol)) == (
        ALLOW if routing else EPERM)
    assert run_bpf(sandbox, nr("socketpair"), (family, 1, 0)) == (ALLOW if low == 1 else EPERM)


@given(U64)
def test_setid_bits_are_refused_in_every_mode_argument(sandbox: bytes, mode: int) -> None:
    expect = EPERM if mode & SETID else ALLOW
    for call, before in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2),
                         ("creat", 1), ("mknod", 1), ("mknodat", 2)):
        assert run_bpf(sandbox, nr(call), (3,) * before + (mode,)) == expect, call
    assert run_bpf(sandbox, nr("mkdir"), (3, mode)) == ALLOW  # the kernel ignores both bits


@given(U64, U64)
def test_open_refuses_setid_modes_only_when_it_creates(sandbox: bytes, flags: int,
                                                       mode: int) -> None:
    creates = flags & (0o100 | 0o20000000)  # O_CREAT, __O_TMPFILE
    expect = EPERM if creates and mode & SETID else ALLOW
    assert run_bpf(sandbox, nr("open"), (3, flags, mode)) == expect
    assert run_bpf(sandbox, nr("openat"), (3, 3, flags, mode)) == expect


@given(U64)
def test_fallocate_only_frees_space(sandbox: bytes, mode: int) -> None:
    low = mode & 0xFFFFFFFF
    allocating = (0, 0x01, 0x10, 0x11, 0x40, 0x41, 0x80)
    expect = ALLOW if low in (0x03, 0x08) else EOPNOTSUPP if low in allocating else EPERM
    assert run_bpf(sandbox, nr("fallocate"), (3, mode, 0, 1 << 31)) == expect
    for mode in (0x00, 0x01, 0x10):  # plain, KEEP_SIZE, ZERO_RANGE: the C library writes
        assert run_bpf(sandbox, nr("fallocate"), (3, mode, 0, 1 << 31)) == EOPNOTSUPP


PIDS = st.one_of(U64, st.sampled_from([0, 1, 2, 3]).flatmap(
    lambda low: HIGH.map(lambda high: high | low)))  # corral's PIDs 1, 2 under any high bits


@given(PIDS, PIDS)
def test_limits_and_scheduling_for_anything_but_corrals_pids(sandbox: bytes, pid: int,
                                                             who: int) -> None:
    # bwrap's PID 1 and corral's init (PID 2) are out of reach, read as a 32-bit pid_t
    payloads = pid & 0xFFFFFFFF not in (1, 2)
    for call in ("prlimit64", "sched_setscheduler", "sched_setparam", "sched_setaffinity",
                 "sched_setattr", "migrate_pages", "move_pages"):
        assert run_bpf(sandbox, nr(call), (pid, 7, 1)) == (ALLOW if payloads else EPERM), call
    mine = who & 0xFFFFFFFF not in (1, 2)
    for which in (0, 1, 2):  # PRIO_PROCESS, PRIO_PGRP (the init's group too), PRIO_USER
        expect = ALLOW if which == 0 and mine else EPERM
        assert run_bpf(sandbox, nr("setpriority"), (which, who, 19)) == expect
    for which in (1, 2, 3):  # IOPRIO_WHO_PROCESS, _PGRP, _USER
        expect = ALLOW if which == 1 and mine else EPERM
        assert run_bpf(sandbox, nr("ioprio_set"), (which, who, 0)) == expect
    assert run_bpf(sandbox, nr("getpriority"), (2, who)) == ALLOW  # reading stays open


@given(U64)
def test_inotify_watches_anything_but_reads(sandbox: bytes, mask: int) -> None:
    expect = EPERM if mask & 0x1 else ALLOW  # IN_ACCESS: a host program's keys on /dev/tty
    assert run_bpf(sandbox, nr("inotify_add_watch"), (3, 4, mask)) == expect


# --- the payload filter -----------------------------------------------------------------------

@given(U32, HIGH)
def test_unix_filter_denies_unix_sockets_and_datagram_pairs(payload: bytes, kind: int,
                                                            high: int) -> None:
    base = kind & ~(0o2000000 | 0o4000)  # SOCK_CLOEXEC, SOCK_NONBLOCK masked off
    expect = EPERM if base in (2, 3) else ALLOW  # SOCK_DGRAM, and SOCK_RAW (a DGRAM for unix)
    assert run_bpf(payload, nr("socketpair"), (1 | high, kind | high)) == expect
    assert run_bpf(payload, nr("socket"), (1 | high, kind)) == EPERM
    assert run_bpf(payload, nr("socket"), (2, kind)) == ALLOW
    assert run_bpf(payload, nr("socketpair"), (2, kind)) == ALLOW  # not its business


def test_unix_filter_keeps_stream_pairs(payload: bytes) -> None:
    for kind in (1, 5, 1 | 0o2000000, 5 | 0o4000):  # SOCK_STREAM, SOCK_SEQPACKET + flags
        assert run_bpf(payload, nr("socketpair"), (1, kind, 0)) == ALLOW
    for kind in (2, 3, 2 | 0o2000000 | 0o4000):
        assert run_bpf(payload, nr("socketpair"), (1, kind, 0)) == EPERM
    assert run_bpf(payload, nr("ptrace"), ()) == ALLOW  # the sandbox filter's business


# --- aarch64 ----------------------------------------------------------------------------------

def test_the_aarch64_program_keeps_the_rules() -> None:
    arm = seccomp.compile_filter(seccomp.EPERM, seccomp.sandbox_rules(), AARCH64)
    read, clone, ioctl, personality, prlimit64, socket, ptrace = 63, 220, 29, 92, 261, 198, 117
    assert run_bpf(arm, read, (0, 0, 1), arch=AARCH64) == ALLOW
    assert run_bpf(arm, clone, (0x01200011,), arch=AARCH64) == ALLOW
    assert run_bpf(arm, clone, (0x10000000,), arch=AARCH64) == EPERM
    assert run_bpf(arm, ioctl, (0, 0x5412), arch=AARCH64) == EPERM
    assert run_bpf(arm, ioctl, (0, 0x5401), arch=AARCH64) == ALLOW
    assert run_bpf(arm, personality, (0x0040000,), arch=AARCH64) == EPERM
    assert run_bpf(arm, prlimit64, (2, 0), arch=AARCH64) == EPERM
    assert run_bpf(arm, prlimit64, (0, 0), arch=AARCH64) == ALLOW
    assert run_bpf(arm, socket, (40, 1), arch=AARCH64) == EPERM
    assert run_bpf(arm, ptrace, (), arch=AARCH64) == EPERM
    assert run_bpf(arm, 435, (), arch=AARCH64) == ENOSYS  # clone3
    assert run_bpf(arm, read, (), arch=X86_64) == EPERM  # another ABI


# --- failing closed ---------------------------------------------------------------------------

def test_doctor_counts_the_table_and_names_what_each_profile_adds() -> None:
    line = seccomp.summary()
    assert f"allow-list of {len(UNCONDITIONAL) + len(NARROWED)} system calls" in line
    assert f"{len(NARROWED)} only in some forms" in line and "foreign ABIs refused" in line
    d = seccomp.describe(("node", "python"))
    assert (d["allowed"], d["narrowed"], d["fallbacks"]) == (
        len(UNCONDITIONAL) + len(NARROWED), len(NARROWED),
        {"ENOSYS": len(FALLBACK), "EOPNOTSUPP": len(FALLBACK_FORMS)})
    assert sum(d["groups"].values()) == d["allowed"]
    assert d["payload_filter"] == {"when": "unix_sockets = false", "profiles": ["node", "python"],
                                   "denies": ["socket(AF_UNIX)", "socketpair(AF_UNIX, SOCK_DGRAM)",
                                              "socketpair(AF_UNIX, SOCK_RAW)"]}


def test_policy_without_libseccomp_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    def clear() -> None:
        seccomp._library.cache_clear()
        seccomp.programs.cache_clear()
        seccomp.compile_filter.cache_clear()

    monkeypatch.setattr(seccomp, "LIBRARY", "libcorral-missing.so.2")
    clear()
    try:
        with pytest.raises(HostError, match=r"cannot be loaded.*--allow no-seccomp"):
            seccomp.for_policy(Policy())
        relaxed = replace(Policy(), allow=Allow(no_seccomp=True))
        assert seccomp.for_policy(relaxed) is None
    finally:
        monkeypatch.undo()
        clear()
    # Control: with the library back, the same policy gets its programs.
    assert seccomp.for_policy(Policy()) is not None
