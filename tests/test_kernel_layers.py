"""Seccomp and Landlock from inside real sandboxes, as root and as the test user.

Every denial is paired with its negative control: the same attempt in the
same sandbox with that one layer removed (``tests/layers.py`` launches
corral's resolved sandbox minus the layer), or in raw bwrap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import SYSTEM_PYTHON, Identity, need, raw_bwrap_argv
from layer_tools import need_x86_64, probe, without

pytestmark = pytest.mark.sandbox
# The kernel refuses these to a payload without capabilities before it looks at the
# arguments, so with the filter off they still fail with EPERM: the control for them is
# the BPF evaluation in test_seccomp_filter.py.
KERNEL_REFUSES_FIRST = {"move_mount", "fsopen", "fsmount", "fspick", "pivot_root", "reboot",
                        "swapoff", "acct", "syslog", "socket(AF_PACKET)", "vhangup"}
# Calls the unfiltered payload really performs here (not just an argument error).
SUCCEED_UNFILTERED = {"add_key", "keyctl", "ptrace", "process_vm_readv", "process_vm_writev",
                      "pidfd_getfd", "kcmp", "userfaultfd", "io_uring_setup", "modify_ldt",
                      "personality(ADDR_NO_RANDOMIZE)", "socket(AF_VSOCK)",
                      "socket(AF_NETLINK, uevent)", "socket(AF_NETLINK, sock_diag)",
                      "fanotify_init", "memfd_secret", "sysfs",
                      "clock_adjtime", "adjtimex", "set_mempolicy_home_node",
                      "personality(UNAME26)", "personality(READ_IMPLIES_EXEC)"}
# Refused with ENOSYS, what a kernel without them says, so that libraries fall back.
FALL_BACK = {"clone3", "openat2", "io_setup", "statmount", "listmount", "lsm_get_self_attr",
             "lsm_list_modules", "setxattrat"}


def _as(who: Identity, argv: list[str]) -> list[str]:
    """``argv`` run as ``who`` (raw bwrap controls for the test user)."""
    if who.uid == os.geteuid():
        return argv
    return ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups", "--", *argv]


def test_status_shows_seccomp_and_no_new_privs(who: Identity, layers: Path) -> None:
    status = "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status"
    r = who.corral_json("--", "/bin/sh", "-c", status)
    assert r["exit_code"] == 0
    assert "Seccomp:\t2" in r["stdout"] and "NoNewPrivs:\t1" in r["stdout"], r["stdout"]
    # Control: the same sandbox without bwrap's filter runs unfiltered.
    ctl = without(who, layers, ["seccomp"], "--", "/bin/sh", "-c", status)
    assert "Seccomp:\t0" in ctl["stdout"], ctl


def test_each_refused_call_fails_with_its_errno(who: Identity, layers: Path) -> None:
    need_x86_64()
    script = probe(who, "syscalls.py")
    r = who.corral_json("--profile", "shell", "--input", str(script), "--",
                        "python3", "syscalls.py")
    assert r["exit_code"] == 0, r["stderr"]
    denied = json.loads(r["stdout"])
    assert len(denied) >= 80
    for name, err in denied.items():
        expected = errno.ENOSYS if name in FALL_BACK else errno.EPERM
        assert err == expected, f"{name}: {errno.errorcode.get(err, err)}"
    # Control: with the filter removed the same calls reach the kernel.
    ctl = without(who, layers, ["seccomp"], "--input", str(script), "--",
                  "python3", "syscalls.py")
    assert ctl["exit_code"] == 0, ctl["stderr"]
    unfiltered = json.loads(ctl["stdout"])
    reached = {name: err for name, err in unfiltered.items() if name not in KERNEL_REFUSES_FIRST}
    assert all(err != errno.EPERM for err in reached.values()), reached
    assert {name for name, err in unfiltered.items() if err == 0} >= SUCCEED_UNFILTERED
    # Root mode has no user namespace of its own, so only the filter stops a nested one;
    # started by a plain user, bwrap's --disable-userns stops it too (ENOSPC).
    for name in ("unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)"):
        assert unfiltered[name] == (0 if who.is_root else errno.ENOSPC), name


@pytest.mark.parametrize("request_", ["0x5412", "0xdead00005412"])
def test_tiocsti_is_blocked_even_with_high_bits(who: Identity, layers: Path,
                                                request_: str) -> None:
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")  # absent before Linux 6.2: always on
    need(not legacy.exists() or legacy.read_text().strip() == "1",
         "the control needs dev.tty.legacy_tiocsti=1")
    script = probe(who, "tiocsti.py")
    ptys = who.tmp / "ptys.toml"  # a fresh terminal inside: runs have none by default
    ptys.write_text("[limits]\nptys = 4\n")
    r = who.corral_json("--profile", str(ptys), "--input", str(script), "--", "python3",
                        "tiocsti.py", request_)
    assert json.loads(r["stdout"]) == {"rc": -1, "errno": errno.EPERM, "read": ""}, r
    ctl = without(who, layers, ["seccomp"], "--profile", str(ptys), "--input", str(script),
                  "--", "python3", "tiocsti.py", request_)
    assert json.loads(ctl["stdout"]) == {"rc": 0, "errno": 0, "read": "Z"}, ctl


def test_i386_syscall_from_a_64_bit_process_is_refused(who: Identity, layers: Path) -> None:
    need_x86_64()
    need(Path("/proc/sys/abi/vsyscall32").exists(), "the kernel has no IA-32 emulation")
    script = probe(who, "int80.py")
    r = who.corral_json("--input", str(script), "--", "python3", "int80.py")
    assert r["exit_code"] == 0 and int(r["stdout"]) == -errno.EPERM, r
    ctl = without(who, layers, ["seccomp"], "--input", str(script), "--", "python3", "int80.py")
    assert ctl["exit_code"] == 0 and int(ctl["stdout"]) > 1, ctl  # getpid() ran


PTRACE_PID1 = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
               "rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(0x4206), ctypes.c_long(1), "
               "ctypes.c_long(0), ctypes.c_long(0)); print(rc, ctypes.get_errno())")


def test_ptrace_of_pid_1_fails(who: Identity, bwrap: str) -> None:
    need_x86_64()
    r = who.corral_json("--", SYSTEM_PYTHON, "-c", PTRACE_PID1)  # PTRACE_SEIZE, no stop
    assert r["stdout"].split() == ["-1", str(errno.EPERM)], r
    # Control (DESIGN fact 3): raw bwrap with a PID namespace lets the payload seize PID 1.
    argv = raw_bwrap_argv(bwrap, ["--unshare-pid"], [SYSTEM_PYTHON, "-c", PTRACE_PID1])
    ctl = subprocess.run(_as(who, argv), capture_output=True, text=True, timeout=120,
                         check=False)
    assert ctl.stdout.split() == ["0", "0"], ctl


class HostSockets(NamedTuple):
    stream: Path  # greets each client
    dgram: Path  # keeps what it receives
    received: list[bytes]


@pytest.fixture
def unix_server(who: Identity) -> Iterator[HostSockets]:
    """A stream and a datagram unix socket on the host, in a directory of their own.

    Not under /tmp: the sandbox's private /tmp would cover a --ro path there.
    """
    folder = Path(tempfile.mkdtemp(prefix="corral-sockets-", dir="/var/tmp"))
    folder.chmod(0o755)
    path, dpath = folder / "host.sock", folder / "host.dgram"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.2)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(str(dpath))
    dgram.settimeout(0.2)
    for p in (path, dpath):
        p.chmod(0o777)
    stop, received = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                received.append(dgram.recv(256))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hello from the host")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield HostSockets(path, dpath, received)
    stop.set()
    thread.join()
    server.close()
    dgram.close()
    shutil.rmtree(folder)


def _settle(received: list[bytes], count: int) -> list[bytes]:
    """What the datagram socket got, once ``count`` messages came (or 10 s passed)."""
    deadline = time.monotonic() + 10
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # and nothing more than that
    return sorted(received)


def test_unix_sockets_follow_the_profile(who: Identity, layers: Path,
                                         unix_server: HostSockets) -> None:
    script = probe(who, "unix.py")
    command = ["--input", str(script), "--", "python3", "unix.py", str(unix_server.stream),
               str(unix_server.dgram)]
    args = ["--ro", str(unix_server.stream.parent), *command]
    strict = json.loads(who.corral_json("--profile", "python", *args)["stdout"])
    assert strict["unix"] == errno.EPERM
    # A datagram pair's end could sendto() any visible datagram socket: refused, SOCK_RAW
    # (which AF_UNIX turns into SOCK_DGRAM) too; stream and seqpacket pairs keep working.
    assert strict["dgram"] == errno.EPERM and strict["raw"] == errno.EPERM
    assert strict["socketpair"] == "pair" and strict["seqpacket"] == "pair"
    assert strict["loopback"] == "tcp"
    # The payload filter is stacked on the payload alone: the init (and the egress bridge
    # that runs in its process) keeps AF_UNIX.
    assert strict["filters"] == [2, 1]
    assert _settle(unix_server.received, 0) == []
    # Controls: the shell profile allows unix sockets, and so does the python profile
    # with the payload filter removed: then both datagram pairs reach the host socket.
    relaxed = json.loads(who.corral_json("--profile", "shell", *args)["stdout"])
    assert relaxed["unix"] == "hello from the host" and relaxed["filters"] == [1, 1]
    assert relaxed["dgram"] == "sent" and relaxed["raw"] == "sent"
    assert _settle(unix_server.received, 2) == [b"from a 2 pair", b"from a 3 pair"]
    unix_server.received.clear()
    ctl = without(who, layers, ["payload-filter"], "--profile", "python", "--ro",
                  str(unix_server.stream.parent), *command)
    assert ctl["exit_code"] == 0 and json.loads(ctl["stdout"])["filters"] == [1, 1]
    assert _settle(unix_server.received, 2) == [b"from a 2 pair", b"from a 3 pair"]


def test_landlock_stops_a_write_the_mounts_allow(who: Identity, layers: Path) -> None:
    extra = who.tmp / "extra"
    extra.mkdir()
    who.chown(extra)
    write = ["--extra-writable", str(extra), "--", "/bin/sh", "-c",
             "echo landed > /extra/f && echo WROTE"]
    r = without(who, layers, [], *write)
    assert "WROTE" not in r["stdout"] and "Permission denied" in r["stderr"], r
    assert not (extra / "f").exists()
    ctl = without(who, layers, ["landlock"], *write)
    assert ctl["stdout"] == "WROTE\n" and (extra / "f").read_text() == "landed\n", ctl


def _library_path() -> str:
    from corral import seccomp

    seccomp.libseccomp_version()  # loads it
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libseccomp" in line}
    assert len(paths) == 1, paths
    return paths.pop()


def test_missing_libseccomp_fails_closed(who: Identity, bwrap: str, readable_src: Path) -> None:
    library = _library_path()
    relax = ["--allow", "no-seccomp"] + (["--allow", "nested-userns"] if who.is_root else [])

    def dry_run(mask: bool, allow: list[str]) -> subprocess.CompletedProcess[str]:
        hide = ["--ro-bind", "/dev/null", library] if mask else []
        args = [*hide, "--tmpfs", "/tmp", "--ro-bind", str(readable_src), str(readable_src),
                "--setenv", "PYTHONPATH", str(readable_src), "--setenv", "HOME", "/tmp"]
        # No cgroup file system in this raw bwrap: limits are not what this test is about.
        cmd = [SYSTEM_PYTHON, "-m", "corral", "run", "--dry-run", "--allow", "unenforced-limits",
               *allow, "--", "/bin/true"]
        return subprocess.run(_as(who, raw_bwrap_argv(bwrap, args, cmd)), capture_output=True,
                              text=True, timeout=120, check=False)

    refused = dry_run(True, [])
    assert refused.returncode == 125, refused
    assert refused.stderr.startswith("corral: error: libseccomp.so.2 cannot be loaded")
    assert "--allow no-seccomp" in refused.stderr
    relaxed = dry_run(True, relax)
    assert relaxed.returncode == 0 and "--seccomp" not in relaxed.stdout, relaxed
    # Control: with the library visible the same dry run hands bwrap a filter.
    normal = dry_run(False, [])
    assert normal.returncode == 0 and "  --seccomp " in normal.stdout, normal


def test_doctor_shows_landlock_and_libseccomp(who: Identity) -> None:
    from corral import seccomp

    r = who.corral("doctor", "--json")
    data = json.loads(r.stdout)
    assert data["libseccomp"] == seccomp.libseccomp_version() and data["landlock_abi"] >= 1
    rows = {p["name"]: p for p in data["protections"]}
    assert rows["seccomp"]["enforced"] and "foreign ABIs refused" in rows["seccomp"]["how"]
    assert f"Landlock ABI {data['landlock_abi']}" in rows["landlock-writes"]["how"]
    # The filter is counted, and the profiles that forbid unix sockets say what they add.
    assert data["seccomp"] == seccomp.describe(("node", "python"))
    text = who.corral("doctor").stdout
    assert f"libseccomp:       {data['libseccomp']}" in text
    assert (f"seccomp filter:   {data['seccomp']['allowed']} calls allowed" in text
            and "node, python (unix_sockets = false) add: socket(AF_UNIX), "
                "socketpair(AF_UNIX, SOCK_DGRAM)" in text), text
