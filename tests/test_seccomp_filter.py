"""The compiled seccomp programs, evaluated instruction by instruction (no kernel involved).

A small classic-BPF interpreter runs libseccomp's output on made-up
``seccomp_data`` records, so every rule is checked for exactly what it
denies and what it lets through: each flag, high bits in 64-bit registers,
foreign ABIs.  The real kernel checks are in ``test_kernel_layers.py``.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import need
from corral import seccomp
from corral.errors import HostError
from corral.policy import Allow, Policy
from corral.seccomp import ASLR_WEAKENING, CLONE_NEW, CLONE_NEWTIME, SANDBOX_RULES, UNIX_RULES

ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
X86_64, I386 = 0xC000003E, 0x40000003
X32_BIT = 0x40000000
NR = {"read": 0, "write": 1, "openat": 257, "mmap": 9, "ioctl": 16, "socket": 41,
      "socketpair": 53, "clone": 56, "execve": 59, "personality": 135, "unshare": 272,
      "clone3": 435, "prctl": 157, "seccomp": 317, "landlock_create_ruleset": 444,
      "pidfd_open": 434, "getpid": 39}
UNCONDITIONAL = {"add_key": 248, "request_key": 249, "keyctl": 250, "ptrace": 101,
                 "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
                 "kcmp": 312, "process_madvise": 440, "setns": 308, "mount": 165,
                 "umount2": 166, "mount_setattr": 442, "move_mount": 429, "open_tree": 428,
                 "open_tree_attr": 467, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
                 "fspick": 433, "pivot_root": 155, "chroot": 161, "open_by_handle_at": 304,
                 "name_to_handle_at": 303, "bpf": 321, "perf_event_open": 298,
                 "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
                 "io_uring_register": 427, "modify_ldt": 154, "kexec_load": 246,
                 "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
                 "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168,
                 "acct": 163, "quotactl": 179, "quotactl_fd": 443, "syslog": 103,
                 "settimeofday": 164, "clock_settime": 227, "iopl": 172, "ioperm": 173}
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


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


@pytest.fixture(scope="module")
def sandbox() -> bytes:
    need(_machine() == "x86_64", "the numbers in these tests are x86_64's")
    return seccomp.programs(True).sandbox


def _machine() -> str:
    import os

    return os.uname().machine


def test_programs_are_cached_per_option() -> None:
    need(_machine() == "x86_64", "x86_64 only")
    assert seccomp.programs(False) is seccomp.programs(False)
    assert seccomp.programs(True).payload is None
    assert seccomp.programs(False).payload == seccomp.compile_rules(UNIX_RULES)
    assert seccomp.programs(False).sandbox is seccomp.programs(True).sandbox
    assert 0 < len(seccomp.programs(True).sandbox) // 8 <= 4096  # BPF_MAXINSNS


@pytest.mark.parametrize(("name", "nr"), sorted(UNCONDITIONAL.items()))
def test_each_listed_call_is_denied_with_eperm(sandbox: bytes, name: str, nr: int) -> None:
    assert run_bpf(sandbox, nr, (1, 2, 3)) == EPERM


def test_clone3_gets_enosys_so_libc_falls_back_on_clone(sandbox: bytes) -> None:
    assert run_bpf(sandbox, NR["clone3"], (0, 88)) == ENOSYS


@pytest.mark.parametrize(("nr", "args"), [
    (NR["read"], (0, 0, 10)), (NR["write"], (1, 0, 10)), (NR["openat"], (0, 0, 0)),
    (NR["execve"], ()), (NR["mmap"], (0, 4096, 7, 0x22)), (NR["prctl"], (22, 2)),
    (NR["seccomp"], (1, 0, 0)), (NR["landlock_create_ruleset"], ()), (NR["getpid"], ()),
    (NR["clone"], (0x01200011,)),  # what fork() passes
    (NR["clone"], (0x003D0F00,)),  # what pthread_create() passes
    (NR["unshare"], (0x00000600,)),  # CLONE_FS | CLONE_FILES
    (NR["ioctl"], (1, 0x5401)),  # TCGETS: isatty()
    (NR["personality"], (0xFFFFFFFF,)), (NR["personality"], (0,)),
    (NR["personality"], (0x0008,)), (NR["personality"], (0x0020000,)),  # LINUX32, UNAME26
    (NR["socket"], (1, 1, 0)), (NR["socket"], (2, 1, 0)), (NR["socket"], (10, 2, 0)),
    (NR["socketpair"], (1, 1, 0)),
    (-1, ()),  # a tracer's "skip this call"
])
def test_everyday_calls_pass(sandbox: bytes, nr: int, args: tuple[int, ...]) -> None:
    assert run_bpf(sandbox, nr, args) == ALLOW


@pytest.mark.parametrize("flag", sorted(CLONE_NEW.values()))
def test_every_namespace_flag_is_denied(sandbox: bytes, flag: int) -> None:
    for call in ("clone", "unshare"):
        assert run_bpf(sandbox, NR[call], (flag,)) == EPERM
        assert run_bpf(sandbox, NR[call], (flag | 0x01200011 | 0xABCD << 32,)) == EPERM
    assert run_bpf(sandbox, NR["unshare"], (CLONE_NEWTIME,)) == EPERM


@given(U64)
def test_namespace_rule_is_exact(sandbox: bytes, flags: int) -> None:
    wanted = sum(CLONE_NEW.values())
    expect = EPERM if flags & wanted else ALLOW
    assert run_bpf(sandbox, NR["clone"], (flags,)) == expect
    expect = EPERM if flags & (wanted | CLONE_NEWTIME) else ALLOW
    assert run_bpf(sandbox, NR["unshare"], (flags,)) == expect


@pytest.mark.parametrize("request_", [0x5412, 0x541C, 0xDEAD00005412, 0xFFFFFFFF0000541C])
def test_terminal_injection_is_denied_whatever_the_high_bits(sandbox: bytes,
                                                             request_: int) -> None:
    assert run_bpf(sandbox, NR["ioctl"], (0, request_)) == EPERM
    assert run_bpf(sandbox, NR["ioctl"], (0, request_ + 1)) == ALLOW


@given(U64)
def test_personality_rule_is_exact(sandbox: bytes, value: int) -> None:
    low = value & 0xFFFFFFFF  # the kernel reads 32 bits
    weak = low & sum(ASLR_WEAKENING.values()) or low & 1 << 31
    expect = EPERM if weak and low != 0xFFFFFFFF else ALLOW
    assert run_bpf(sandbox, NR["personality"], (value,)) == expect


@pytest.mark.parametrize("flag", sorted(ASLR_WEAKENING.values()))
def test_each_aslr_weakening_flag_is_denied(sandbox: bytes, flag: int) -> None:
    for persona in (0, 0x0008, 0x0020000, 0x7FFFFFFF, 0xFFFFFFFE):
        assert run_bpf(sandbox, NR["personality"], (persona | flag,)) == EPERM


@given(U64)
def test_only_unix_and_inet_families_pass(sandbox: bytes, family: int) -> None:
    expect = ALLOW if family in (1, 2, 10) else EPERM
    assert run_bpf(sandbox, NR["socket"], (family, 1, 0)) == expect
    assert run_bpf(sandbox, NR["socketpair"], (family, 1, 0)) == expect


@pytest.mark.parametrize("family", [0, 3, 9, 11, 16, 17, 38, 40, 1 << 32 | 1, -1 & (1 << 64) - 1])
def test_named_families_are_denied(sandbox: bytes, family: int) -> None:
    assert run_bpf(sandbox, NR["socket"], (family, 1, 0)) == EPERM


@given(st.integers(min_value=0, max_value=500))
def test_foreign_abis_are_refused(sandbox: bytes, nr: int) -> None:
    assert run_bpf(sandbox, nr, arch=I386) == EPERM
    assert run_bpf(sandbox, nr | X32_BIT) == EPERM


def test_unix_filter_denies_only_unix_socket_creation() -> None:
    need(_machine() == "x86_64", "x86_64 only")
    unix = seccomp.programs(False).payload
    assert unix is not None
    assert run_bpf(unix, NR["socket"], (1, 1, 0)) == EPERM
    assert run_bpf(unix, NR["socket"], (1 | 7 << 32, 1, 0)) == EPERM  # kernel reads 32 bits
    for nr, args in ((NR["socket"], (2, 1, 0)), (NR["socket"], (10, 1, 0)),
                     (NR["socketpair"], (1, 1, 0)), (UNCONDITIONAL["ptrace"], ())):
        assert run_bpf(unix, nr, args) == ALLOW


def test_every_rule_is_documented() -> None:
    doc = seccomp.__doc__ or ""
    for rule in (*SANDBOX_RULES, *UNIX_RULES):
        assert rule.syscall in doc, f"{rule.syscall} has no row in seccomp's rule table"


def test_policy_without_libseccomp_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp, "LIBRARY", "libcorral-missing.so.2")
    seccomp._library.cache_clear()
    seccomp.programs.cache_clear()
    seccomp.compile_rules.cache_clear()
    try:
        with pytest.raises(HostError, match=r"cannot be loaded.*--allow no-seccomp"):
            seccomp.for_policy(Policy())
        relaxed = replace(Policy(), allow=Allow(no_seccomp=True))
        assert seccomp.for_policy(relaxed) is None
    finally:
        monkeypatch.undo()
        seccomp._library.cache_clear()
        seccomp.programs.cache_clear()
        seccomp.compile_rules.cache_clear()
    # Control: with the library back, the same policy gets its programs.
    assert seccomp.for_policy(Policy()) is not None
