"""The allow-list's argument rules in real sandboxes, as root and as the test user.

Each refusal runs beside its negative control: the same attempt in the same
sandbox with the filter removed (``tests/layers.py``) succeeds.  The rules
themselves, form by form, are checked on the compiled program in
``test_seccomp_filter.py``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, need
from layer_tools import give, need_x86_64, probe, without

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("each_init")]

UID_ONLY = ("prlimit64", "setpriority(PRIO_PROCESS)", "setpriority(PRIO_USER 0)",
            "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
            "ioprio_set")


def test_the_payload_cannot_reach_its_init(who: Identity, layers: Path) -> None:
    need_x86_64()
    script = probe(who, "reach_init.py")
    for target in ("parent", "1"):  # corral's init, and bwrap's PID 1
        r = who.corral_json("--input", str(script), "--", "python3", "reach_init.py", target)
        out = json.loads(r["stdout"])
        assert out.pop("sched_getaffinity") == 0, out  # reading stays open
        assert set(out.values()) == {errno.EPERM}, (target, out)
    # Control: without the filter the kernel checks only the uid, and every call lands on
    # corral's init (migrate_pages and move_pages stop at its being not dumpable; signals
    # at Landlock's scope, which the next control removes).
    ctl = json.loads(without(who, layers, ["seccomp"], "--input", str(script), "--", "python3",
                             "reach_init.py", "parent")["stdout"])
    assert {name: ctl[name] for name in UID_ONLY} == dict.fromkeys(UID_ONLY, 0), ctl
    assert ctl["kill(0)"] == ctl["pidfd_send_signal(0)"] == errno.EPERM, ctl
    ctl = json.loads(without(who, layers, ["landlock"], "--input", str(script), "--",
                             "python3", "reach_init.py", "parent")["stdout"])
    assert ctl["kill(0)"] == ctl["pidfd_send_signal(0)"] == 0, ctl


def test_the_payload_tunes_its_own_processes_and_threads(who: Identity) -> None:
    # pthread_setaffinity_np and pthread_setschedparam name the thread by its id; renice -p,
    # taskset -p and prlimit --pid name a process: all of them the payload's own.
    script = probe(who, "reach_init.py")
    for target in ("child", "thread"):
        r = who.corral_json("--input", str(script), "--", "python3", "reach_init.py", target)
        out = json.loads(r["stdout"])
        # The process group and the uid include the init: those stay the caller's own only.
        assert out.pop("setpriority(PRIO_PGRP 0)") == out.pop("setpriority(PRIO_USER 0)") \
            == errno.EPERM, (target, out)
        assert out.pop("migrate_pages") == errno.EINVAL, out  # the kernel reads its masks
        if target == "thread":
            out.pop("pidfd_send_signal(0)")  # pidfd_open takes a process, not a thread
        assert set(out.values()) == {0}, (target, out)


def test_the_init_stops_the_launch_where_it_is_not_the_protected_pid(
        who: Identity, layers: Path) -> None:
    r = without(who, layers, [], "--init-pid", "3", "--", "/bin/true")
    assert r["status"] == "refused", r
    assert r["error"].startswith("corral's init could not start the command: corral's init "
                                 "is PID 2 with 1 thread(s), not PID 3 with one; "), r
    ok = without(who, layers, [], "--init-pid", "2", "--", "/bin/true")  # control
    assert ok["status"] == "exited" and ok["exit_code"] == 0, ok


COUNT_THREADS = """\
import os, threading
from corral import inner
inner.check_alone(os.getpid())  # one thread, like the init
threading.Thread(target=threading.Event().wait, daemon=True).start()
try:
    inner.check_alone(os.getpid())
except inner.SetupError as e:
    print(e)
"""


def test_the_init_counts_its_threads() -> None:
    # A fresh process: this one may hold threads of earlier tests.
    out = subprocess.run([sys.executable, "-c", COUNT_THREADS], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "with 2 thread(s), not PID" in out, out


ATTACK = """\
import os, resource, socket, time, urllib.parse
init = os.getppid()
try:
    resource.prlimit(init, resource.RLIMIT_NOFILE, (3, 3))
    resource.prlimit(init, resource.RLIMIT_CPU, (1, 1))
    print("limited the init", flush=True)
except OSError as e:
    print("refused", e.errno, flush=True)
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
held = []
for _ in range(3):  # the bridge's accept() now fails (EMFILE) and its loop spins
    try:
        held.append(socket.create_connection((proxy.hostname, proxy.port), timeout=2))
    except OSError:
        pass
time.sleep(6)
print("the payload ends well", flush=True)
"""


def test_the_payload_cannot_kill_its_init_and_forge_the_outcome(who: Identity,
                                                                 layers: Path) -> None:
    script = give(who, "attack.py", ATTACK)
    net = ["--profile", "python", "--allow-domain", "origin.test"]
    r = who.corral_json(*net, "--input", str(script), "--", "python3", "attack.py")
    assert r["status"] == "exited" and r["exit_code"] == 0, r
    assert r["stdout"] == f"refused {errno.EPERM}\nthe payload ends well\n"
    # Control (the reproduction): without the filter the init's CPU limit kills it
    # a second later; corral says so, instead of passing on a "signaled" 137.
    ctl = without(who, layers, ["seccomp"], *net, "--input", str(script), "--", "python3",
                  "attack.py")
    assert ctl["stdout"].startswith("limited the init\n"), ctl
    assert ctl["status"] == "error" and ctl["exit_code"] == 125, ctl
    assert ctl["error"].startswith("corral's init died after the command started"), ctl


def _exe(pid: int | str) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def _init_of(marker: str, timeout: float = 60) -> int:
    """The host pid of the corral init whose payload's command line carries ``marker``:
    a child of bwrap's PID 1 running inner.py in Python, or the compiled init (bwrap's own
    command lines carry the marker too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                ppid = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]
            except (OSError, IndexError):
                continue
            python = b"/run/corral/init.py" in argv and _exe(entry).startswith("python")
            compiled = argv[0] == b"/run/corral/init" and _exe(entry) == "init"
            if ((python or compiled) and any(marker.encode() in a for a in argv)
                    and _exe(ppid) == "bwrap"):
                return int(entry)
        time.sleep(0.05)
    raise AssertionError(f"no init for {marker}")


def _payload_of(init: int, timeout: float = 60) -> int:
    """The init's child, once it has become the payload (``sh``: exec done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{init}/task/{init}/children") as f:
            children = f.read().split()
        if children and _exe(children[0]) in ("sh", "dash", "bash") and _waiting(init):
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"init {init} started nothing")


def _waiting(init: int) -> bool:
    """The init sits in poll (watching the payload and the launcher) or wait4, so it has
    reported "started" (it does so just before): a kill between the payload's exec and
    that report is a launch failure, not this test's case."""
    try:
        with open(f"/proc/{init}/syscall") as f:
            return f.read().split()[0] in ("7", "61")  # x86_64 poll, wait4
    except (OSError, IndexError):
        return False


def _run_and_kill(who: Identity, victim: str) -> tuple[subprocess.CompletedProcess[str],
                                                         dict[str, Any]]:
    need(os.geteuid() == 0, "the test kills the sandbox's processes from the host")
    need_x86_64()
    marker = f"corral-init-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--json", "--", "/bin/sh",
                             "-c", f"sleep 60; : {marker}"], env=who.environ(), cwd=who.tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        init = _init_of(marker)
        payload = _payload_of(init)
        os.kill(init if victim == "init" else payload, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), json.loads(out)


def test_a_dead_init_is_a_corral_error_everywhere(who: Identity) -> None:
    proc, result = _run_and_kill(who, "init")
    assert proc.returncode == 125, proc
    assert result["status"] == "error" and result["exit_code"] == 125 and result["signal"] is None
    assert result["error"].startswith("corral's init died after the command started")
    assert proc.stderr == f"corral: error: {result['error']}\n"  # one line
    record = json.loads(Path(result["record"]).read_text())
    assert record["status"] == "error" and record["error"] == result["error"]
    # Control: the same kill aimed at the command is the command's own outcome.
    proc, result = _run_and_kill(who, "payload")
    assert proc.returncode == 137 and result["status"] == "signaled" and result["signal"] == 9
    assert result["error"] is None and proc.stderr == ""


def test_no_setid_bit_can_be_set(who: Identity, layers: Path) -> None:
    need_x86_64()
    script = probe(who, "setid.py")
    r = who.corral_json("--input", str(script), "--", "python3", "setid.py")
    out = json.loads(r["stdout"])
    assert out.pop("mkdir") == "0o755" and out.pop("chmod 0750") == "0o750", out
    assert set(out.values()) == {errno.EPERM}, out
    # Control: without the filter every one of them leaves a set-uid, set-gid file.
    ctl = json.loads(without(who, layers, ["seccomp"], "--input", str(script), "--", "python3",
                             "setid.py")["stdout"])
    assert ctl.pop("mkdir") == "0o755", ctl  # the kernel strips the bits itself
    ctl.pop("chmod 0750")
    assert set(ctl.values()) == {"0o6755"}, ctl


FALLOCATE = """\
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
out = {}
for name, mode, size in (("keep-size", 0x01, 2 << 30), ("plain", 0, 64 << 20),
                         ("posix_fallocate", None, 1 << 20), ("punch-hole", 0x03, 1 << 20)):
    fd = os.open("space", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if name == "punch-hole":
            os.write(fd, b"x" * (1 << 20))
        if mode is None:
            os.posix_fallocate(fd, 0, size)  # the C library's: writes where fallocate cannot
        elif libc.fallocate(fd, mode, 0, size) != 0:
            out[name] = ctypes.get_errno()
            continue
        out[name] = os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)
        os.unlink("space")  # the space goes back at once, control or not
print(json.dumps(out))
"""


def test_fallocate_cannot_allocate_past_the_end(who: Identity, layers: Path) -> None:
    script = give(who, "fallocate.py", FALLOCATE)
    r = who.corral_json("--disk", "16M", "--input", str(script), "--", "python3",
                        "fallocate.py")
    out = json.loads(r["stdout"])
    # What a file system without fallocate says; posix_fallocate then writes the blocks.
    assert out["keep-size"] == out["plain"] == errno.EOPNOTSUPP, out
    assert out["posix_fallocate"] >= 1 << 20 and out["punch-hole"] < 1 << 20, out
    assert r["status"] == "exited", r
    # Control: without the rule the 2 GiB and the 64 MiB land at once, far past --disk.
    ctl = json.loads(without(who, layers, ["seccomp"], "--input", str(script), "--",
                             "python3", "fallocate.py")["stdout"])
    assert ctl["keep-size"] >= 2 << 30 and ctl["plain"] >= 64 << 20, ctl


def test_terminal_requests_programs_need_work_and_the_rest_fail(who: Identity,
                                                                layers: Path) -> None:
    script = probe(who, "terminal.py")
    ptys = give(who, "ptys.toml", "[limits]\nptys = 4\n")  # runs have none by default
    r = json.loads(who.corral_json("--profile", str(ptys), "--input", str(script), "--",
                                   "python3", "terminal.py")["stdout"])
    assert r == {"raw": "ok", "winsize": [24, 80], "drain": "ok", "stty": ["30", "100"],
                 "TCXONC": errno.EPERM, "TIOCEXCL": errno.EPERM, "TIOCSETD": errno.EPERM}, r
    ctl = json.loads(without(who, layers, ["seccomp"], "--profile", str(ptys), "--input",
                             str(script), "--", "python3", "terminal.py")["stdout"])
    assert (ctl["TCXONC"], ctl["TIOCEXCL"], ctl["TIOCSETD"]) == ("done",) * 3, ctl


def test_uretprobe_is_the_kernels_business(who: Identity, layers: Path) -> None:
    """The kernel passes uretprobe through seccomp (Linux 6.13 and later), so no rule can
    refuse it; called from anywhere but the kernel's own trampoline it kills the caller.
    Shown in the sandbox and without its filter alike, so the threat model says what holds."""
    need_x86_64()
    code = "import ctypes; ctypes.CDLL(None).syscall(335); print('returned')"
    r = who.corral_json("--", "python3", "-c", code)
    need(r["stdout"] != "returned\n", "this kernel has no uretprobe")
    assert (r["status"], r["signal"]) == ("signaled", signal.SIGILL), r
    ctl = without(who, layers, ["seccomp"], "--", "python3", "-c", code)
    assert ctl["status"] == "signaled" and ctl["exit_code"] == 128 + signal.SIGILL, ctl
