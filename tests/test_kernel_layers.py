"""Seccomp and Landlock from inside real sandboxes, as root and as the test user.

Every denial is paired with its negative control: the same attempt in the
same sandbox with that one layer removed (``tests/layers.py`` launches
corral's resolved sandbox minus the layer), or in raw bwrap.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import CI, SYSTEM_PYTHON, Identity, need, raw_bwrap_argv

pytestmark = pytest.mark.sandbox
HERE = Path(__file__).resolve().parent
PROBES = HERE / "probes"
# The kernel refuses these to a payload without capabilities before it looks at the
# arguments, so with the filter off they still fail with EPERM: the control for them is
# the BPF evaluation in test_seccomp_filter.py.
KERNEL_REFUSES_FIRST = {"move_mount", "fsopen", "fsmount", "fspick", "pivot_root", "reboot",
                        "swapoff", "acct", "syslog", "socket(AF_PACKET)"}
# Calls the unfiltered payload really performs here (not just an argument error).
SUCCEED_UNFILTERED = {"add_key", "keyctl", "ptrace", "process_vm_readv", "process_vm_writev",
                      "pidfd_getfd", "kcmp", "userfaultfd", "io_uring_setup", "modify_ldt",
                      "personality(ADDR_NO_RANDOMIZE)", "socket(AF_VSOCK)",
                      "socket(AF_NETLINK)"}


def _need_x86_64() -> None:
    need(os.uname().machine == "x86_64", "the probe uses x86_64 system-call numbers")


@pytest.fixture(scope="session")
def layers(shared_tmp: Path) -> Path:
    """tests/layers.py, copied where the test user can read it."""
    dest = shared_tmp / "layers.py"
    shutil.copy(HERE / "layers.py", dest)
    dest.chmod(0o644)
    return dest


def _give(who: Identity, name: str, text: str | bytes) -> Path:
    path = who.tmp / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o644)
    return who.chown(path)


def _probe(who: Identity, name: str) -> Path:
    return _give(who, name, (PROBES / name).read_text())


def without(who: Identity, layers: Path, off: list[str], *args: str) -> dict[str, Any]:
    """Run corral's sandbox with the ``off`` layers removed; see tests/layers.py."""
    flags = [word for layer in off for word in ("--off", layer)]
    proc = subprocess.run([*who.prefix(), str(layers), *flags, *args], env=who.environ(),
                          cwd=who.tmp, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


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


def test_each_denied_call_fails_with_eperm(who: Identity, layers: Path) -> None:
    _need_x86_64()
    probe = _probe(who, "syscalls.py")
    r = who.corral_json("--profile", "shell", "--input", str(probe), "--",
                        "python3", "syscalls.py")
    assert r["exit_code"] == 0, r["stderr"]
    denied = json.loads(r["stdout"])
    assert len(denied) >= 55
    for name, err in denied.items():
        expected = errno.ENOSYS if name == "clone3" else errno.EPERM
        assert err == expected, f"{name}: {errno.errorcode.get(err, err)}"
    # Control: with the filter removed the same calls reach the kernel.
    ctl = without(who, layers, ["seccomp"], "--input", str(probe), "--",
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
    probe = _probe(who, "tiocsti.py")
    ptys = who.tmp / "ptys.toml"  # a fresh terminal inside: runs have none by default
    ptys.write_text("[limits]\nptys = 4\n")
    r = who.corral_json("--profile", str(ptys), "--input", str(probe), "--", "python3",
                        "tiocsti.py", request_)
    assert json.loads(r["stdout"]) == {"rc": -1, "errno": errno.EPERM, "read": ""}, r
    ctl = without(who, layers, ["seccomp"], "--profile", str(ptys), "--input", str(probe),
                  "--", "python3", "tiocsti.py", request_)
    assert json.loads(ctl["stdout"]) == {"rc": 0, "errno": 0, "read": "Z"}, ctl


def test_i386_syscall_from_a_64_bit_process_is_refused(who: Identity, layers: Path) -> None:
    _need_x86_64()
    need(Path("/proc/sys/abi/vsyscall32").exists(), "the kernel has no IA-32 emulation")
    probe = _probe(who, "int80.py")
    r = who.corral_json("--input", str(probe), "--", "python3", "int80.py")
    assert r["exit_code"] == 0 and int(r["stdout"]) == -errno.EPERM, r
    ctl = without(who, layers, ["seccomp"], "--input", str(probe), "--", "python3", "int80.py")
    assert ctl["exit_code"] == 0 and int(ctl["stdout"]) > 1, ctl  # getpid() ran


PTRACE_PID1 = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
               "rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(0x4206), ctypes.c_long(1), "
               "ctypes.c_long(0), ctypes.c_long(0)); print(rc, ctypes.get_errno())")


def test_ptrace_of_pid_1_fails(who: Identity, bwrap: str) -> None:
    _need_x86_64()
    r = who.corral_json("--", SYSTEM_PYTHON, "-c", PTRACE_PID1)  # PTRACE_SEIZE, no stop
    assert r["stdout"].split() == ["-1", str(errno.EPERM)], r
    # Control (DESIGN fact 3): raw bwrap with a PID namespace lets the payload seize PID 1.
    argv = raw_bwrap_argv(bwrap, ["--unshare-pid"], [SYSTEM_PYTHON, "-c", PTRACE_PID1])
    ctl = subprocess.run(_as(who, argv), capture_output=True, text=True, timeout=120,
                         check=False)
    assert ctl.stdout.split() == ["0", "0"], ctl


@pytest.fixture
def unix_server(who: Identity) -> Iterator[Path]:
    """A unix socket on the host, in a directory of its own, that greets each client.

    Not under /tmp: the sandbox's private /tmp would cover a --ro path there.
    """
    folder = Path(tempfile.mkdtemp(prefix="corral-sockets-", dir="/var/tmp"))
    folder.chmod(0o755)
    path = folder / "host.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hello from the host")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join()
    server.close()
    shutil.rmtree(folder)


def test_unix_sockets_follow_the_profile(who: Identity, layers: Path, unix_server: Path) -> None:
    probe = _probe(who, "unix.py")
    args = ["--ro", str(unix_server.parent), "--input", str(probe), "--", "python3", "unix.py",
            str(unix_server)]
    strict = json.loads(who.corral_json("--profile", "python", *args)["stdout"])
    assert strict["unix"] == errno.EPERM
    assert strict["socketpair"] == "pair" and strict["loopback"] == "tcp"
    # The payload filter is stacked on the payload alone: the init (and the egress bridge
    # that runs in its process) keeps AF_UNIX.
    assert strict["filters"] == [2, 1]
    # Controls: the shell profile allows unix sockets, and so does the python profile
    # with the payload filter removed.
    relaxed = json.loads(who.corral_json("--profile", "shell", *args)["stdout"])
    assert relaxed["unix"] == "hello from the host" and relaxed["filters"] == [1, 1]
    ctl = without(who, layers, ["payload-filter"], "--profile", "python", "--input", str(probe),
                  "--", "python3", "unix.py", str(unix_server))
    assert ctl["exit_code"] == 0 and json.loads(ctl["stdout"])["filters"] == [1, 1]


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


SCRIPT_PY = """\
import asyncio, multiprocessing, subprocess

async def child():
    proc = await asyncio.create_subprocess_exec("/bin/echo", "async", stdout=subprocess.PIPE)
    return (await proc.communicate())[0].decode().strip()

def square(x):
    return x * x

if __name__ == "__main__":
    with multiprocessing.Pool(2) as pool:
        print(asyncio.run(child()), sum(pool.map(square, range(4))))
"""
SCRIPT_JS = """\
const out = require('child_process').execFileSync('/bin/echo', ['child']).toString().trim();
const net = require('net');
const server = net.createServer(c => c.end('tcp')).listen(0, '127.0.0.1', () => {
  net.connect(server.address().port, '127.0.0.1')
    .on('data', d => { console.log(out, d.toString()); server.close(); });
});
"""


def test_python_and_node_scripts_run_under_their_profiles(who: Identity) -> None:
    py = _give(who, "work.py", SCRIPT_PY)
    r = who.corral_json("--input", str(py), "--", "python3", "work.py")
    assert r["exit_code"] == 0 and r["stdout"] == "async 14\n", r
    if shutil.which("node") is None:
        need(not CI, "node is not installed")
        return
    js = _give(who, "work.js", SCRIPT_JS)
    r = who.corral_json("--input", str(js), "--", "node", "work.js")
    assert r["exit_code"] == 0 and r["stdout"] == "child tcp\n", r


def _wheel(folder: Path) -> Path:
    """A tiny pure-Python project, packed as a wheel by hand (no build tools, no network)."""
    import base64
    import hashlib

    files = {
        "corral_demo/__init__.py": "def hello():\n    return 'hello from a wheel'\n",
        "corral_demo-0.1.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: corral-demo\nVersion: 0.1\n",
        "corral_demo-0.1.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: corral-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files["corral_demo-0.1.dist-info/RECORD"] = "\n".join(
        [*record, "corral_demo-0.1.dist-info/RECORD,,"]) + "\n"
    path = folder / "corral_demo-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    path.chmod(0o644)
    return path


def test_pip_installs_a_local_wheel_into_a_venv(who: Identity) -> None:
    wheel = who.chown(_wheel(who.tmp))
    steps = ("python3 -m venv /work/venv && "
             "/work/venv/bin/pip install --no-index --quiet /work/corral_demo-0.1-py3-none-any.whl"
             " && /work/venv/bin/python -c 'import corral_demo; print(corral_demo.hello())'")
    r = who.corral_json("--profile", "python", "--input", str(wheel), "--", "/bin/sh", "-c", steps)
    assert r["exit_code"] == 0 and r["stdout"].endswith("hello from a wheel\n"), r


def test_git_commit_and_gcc_work(who: Identity) -> None:
    need(shutil.which("gcc") is not None and shutil.which("git") is not None,
         "gcc and git are needed")
    source = _give(who, "hello.c", '#include <stdio.h>\nint main(void) '
                                   '{ puts("compiled and ran"); return 0; }\n')
    steps = ("git init -q repo && cd repo && echo data > f && git add f && "
             "git -c user.name=corral -c user.email=corral@example.invalid commit -qm first && "
             "git log --format=%s && cd /work && gcc -O1 -o hello hello.c && ./hello")
    r = who.corral_json("--input", str(source), "--", "/bin/sh", "-c", steps)
    assert r["exit_code"] == 0 and r["stdout"] == "first\ncompiled and ran\n", r


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
    text = who.corral("doctor").stdout
    assert f"libseccomp:       {data['libseccomp']}" in text
