"""corral probe's battery: attempts made INSIDE the sandbox under test.

Run as ``python3 battery.py LAUNCH CONFIG_JSON`` by whatever launcher is being
audited, so it uses the standard library only (Python 3.9 or newer) and never
imports corral (under a foreign launcher corral is not there).  It judges nothing: each
attempt in ``CONFIG["attempts"]`` is made and reported as one JSON line on
stdout, prefixed with ``@@corral-probe@@``::

    {"id": ..., "begin": true}                     before the attempt
    {"id": ..., "progress": N}                     bounded attempts, as they grow
    {"id": ..., "ok": true|false|null, "detail": ..., ...}

``ok`` says whether the operation itself succeeded (a write happened, a
socket connected); ``null`` means the battery could not make the attempt.
Reads never report content: only the canary tokens found in it (the
pattern is ``CONFIG["prefix"]`` and 16 hex digits), so a real secret that a
weak sandbox exposes is never copied into the report.

Every attempt is bounded and aimed only at things the probe planted: its
own files and sockets, servers on 127.0.0.1, and the sandbox's own PID 1.
The process ends with ``CONFIG["exit"]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import re
import resource
import select
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

TAG = "@@corral-probe@@"
Result = dict[str, Any]
Report = Callable[[Any], None]  # progress: a count to the launcher, a record inside a child
CHUNK = 8 << 20
SLEEPER = "import sys, time; time.sleep(float(sys.argv[2]))"
SPINNER = ("import os, sys, time\nos.nice(10)\nend = time.monotonic() + float(sys.argv[2])\n"
           "while time.monotonic() < end:\n    pass\n"
           "if len(sys.argv) > 3:\n    print(sys.argv[3], flush=True)")
# Linux system call numbers that glibc has no wrapper for (io_uring_setup is 425 everywhere).
SYSCALLS = {
    "x86_64": {"add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298,
               "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425},
    "aarch64": {"add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241,
                "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425},
}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
PTRACE_SEIZE, PR_SET_PDEATHSIG = 0x4206, 1
KEY_SPEC_SESSION_KEYRING, KEYCTL_GET_KEYRING_ID, KEYCTL_READ = -3, 0, 11


def emit(record: Result) -> None:
    sys.stdout.write(TAG + " " + json.dumps(record) + "\n")
    sys.stdout.flush()


def done(detail: str, **extra: Any) -> Result:
    return dict(extra, ok=True, detail=detail)


def refused(detail: str, **extra: Any) -> Result:
    return dict(extra, ok=False, detail=detail)


def why(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    return f"{name}: {e.strerror or e}"


def libc() -> Any:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    return lib


def syscall(name: str, *args: Any) -> int:
    """A raw system call; returns its result or raises OSError."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        raise RuntimeError(f"no system call table for {platform.machine()}")
    result = libc().syscall(ctypes.c_long(numbers[name]), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def check(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Battery:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.canary = re.compile(re.escape(cfg["prefix"]).encode() + rb"[0-9a-f]{16}")

    def found(self, data: bytes) -> list[str]:
        return sorted({m.decode() for m in self.canary.findall(data)})

    def run(self, attempts: list[Result]) -> None:
        for attempt in attempts:
            emit({"id": attempt["id"], "begin": True})
            op = OPS[attempt["op"]]

            def progress(value: int, ident: str = attempt["id"]) -> None:
                emit({"id": ident, "progress": value})
            try:
                result = op(self, attempt, progress)
            except OSError as e:
                result = refused(why(e))
            except Exception as e:  # the battery itself failed: never a pass
                result = {"ok": None, "detail": f"battery error: {type(e).__name__}: {e}"}
            emit(dict(result, id=attempt["id"]))


# --- files ------------------------------------------------------------------------------

def op_append(b: Battery, a: Result, _: Report) -> Result:
    with open(a["path"], "ab") as f:
        f.write(b"# corral probe: this line must never reach the host\n")
    return done("appended a line")


def op_create(b: Battery, a: Result, _: Report) -> Result:
    parent = os.path.dirname(a["path"])
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(a["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    with os.fdopen(fd, "wb") as f:
        f.write(a.get("text", "#!/bin/sh\n# planted by corral probe\n").encode())
    return done("created the file")


def op_mkfifo(b: Battery, a: Result, _: Report) -> Result:
    os.makedirs(os.path.dirname(a["path"]), exist_ok=True)
    os.mkfifo(a["path"], 0o644)
    return done("made the FIFO")


def op_setid(b: Battery, a: Result, _: Report) -> Result:
    """A file with the set-user-ID and set-group-ID bits, if the sandbox lets them be set."""
    fd = os.open(a["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    os.close(fd)
    os.chmod(a["path"], 0o6755)
    mode = os.stat(a["path"]).st_mode
    if mode & 0o6000:
        return done(f"its mode is {mode & 0o7777:04o} inside")
    return refused(f"the bits did not stick ({mode & 0o7777:04o})")


def op_chmod(b: Battery, a: Result, _: Report) -> Result:
    os.chmod(a["path"], 0o777)
    return done("changed its mode to 0777")


def op_delete(b: Battery, a: Result, _: Report) -> Result:
    os.unlink(a["path"])
    return done("deleted it")


def op_rename(b: Battery, a: Result, _: Report) -> Result:
    os.rename(a["path"], a["to"])
    os.rename(a["to"], a["path"])  # back at once, so later attempts find it in place
    return done(f"renamed it to {os.path.basename(a['to'])} (and back)")


def op_read(b: Battery, a: Result, _: Report) -> Result:
    with open(a["path"], "rb") as f:
        data = f.read(1 << 20)
    return done(f"read {len(data)} bytes", bytes=len(data), found=b.found(data))


def op_list(b: Battery, a: Result, _: Report) -> Result:
    names = os.listdir(a["path"])
    seen = sorted(n for n in names if n in a.get("names", ()))
    return done(f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}", count=len(names),
                names=seen)


# --- secrets outside files -------------------------------------------------------------

def op_environ(b: Battery, a: Result, _: Report) -> Result:
    data = "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()
    return done(f"{len(os.environ)} variables", found=b.found(data))


def op_proc(b: Battery, a: Result, _: Report) -> Result:
    """Canary tokens in /proc/PID/FILE of PID ``a["pid"]``, or of every other process."""
    if "pid" in a:
        with open(f"/proc/{a['pid']}/{a['file']}", "rb") as f:
            data = f.read(1 << 20)
        return done(f"read {len(data)} bytes", found=b.found(data))
    pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    found, readable = set(), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/{a['file']}", "rb") as f:
                found.update(b.found(f.read(1 << 20)))
            readable += 1
        except OSError:
            continue  # gone, or not ours to read
    return done(f"read {readable} of {len(pids)} other processes' {a['file']}",
                found=sorted(found))


def op_keyring(b: Battery, a: Result, _: Report) -> Result:
    serial = syscall("request_key", b"user", a["description"].encode(), None, ctypes.c_long(0))
    buf = ctypes.create_string_buffer(4096)
    n = syscall("keyctl", ctypes.c_long(KEYCTL_READ), ctypes.c_long(serial), buf,
                ctypes.c_long(len(buf)))
    return done(f"found key {serial} and read {n} bytes", found=b.found(buf.raw[:n]))


def op_fds(b: Battery, a: Result, _: Report) -> Result:
    """Canary tokens in any file descriptor this process inherited beyond 0, 1 and 2."""
    found, names = set(), []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd < 3:
            continue
        try:
            found.update(b.found(os.pread(fd, 1 << 16, 0)))
            names.append(name)
        except OSError:
            continue
    return done(f"{len(names)} readable inherited descriptors", found=sorted(found))


# --- network ----------------------------------------------------------------------------

def say(s: socket.socket) -> None:
    """Greet a server once connected; it may already have hung up, which changes nothing."""
    with contextlib.suppress(OSError):
        s.sendall(b"corral-probe\n")


def op_tcp(b: Battery, a: Result, _: Report) -> Result:
    if not a["port"]:
        return refused("the host has no such loopback address: nothing to reach")
    family = socket.AF_INET6 if ":" in a["host"] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect((a["host"], int(a["port"])))
        say(s)
    return done(f"connected to {a['host']} port {a['port']}")


def op_udp(b: Battery, a: Result, _: Report) -> Result:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"corral-probe\n", (a["host"], int(a["port"])))
    return done(f"sent a datagram to {a['host']} port {a['port']}")


def op_unix(b: Battery, a: Result, _: Report) -> Result:
    address = a["path"] if "path" in a else "\0" + a["abstract"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(address)
        say(s)
    return done("connected")


def op_unix_dgram(b: Battery, a: Result, _: Report) -> Result:
    """From one end of a unix datagram socket pair, sendto() a host datagram socket: the
    pair needs no socket(AF_UNIX), and its end may address any visible path.  SOCK_RAW
    too, which AF_UNIX turns into SOCK_DGRAM."""
    tried = []
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            ends = socket.socketpair(socket.AF_UNIX, kind)
        except OSError as e:
            tried.append(f"socketpair type {int(kind)}: {why(e)}")
            continue
        with ends[0], ends[1]:
            try:
                ends[0].sendto(b"corral-probe\n", a["path"])
            except OSError as e:
                tried.append(f"sendto from a type {int(kind)} pair: {why(e)}")
                continue
        return done(f"sent a datagram from a socket pair of type {int(kind)}")
    return refused("; ".join(tried))


def op_interfaces(b: Battery, a: Result, _: Report) -> Result:
    # /proc/self/net follows this process's network namespace; /sys/class/net follows
    # whoever mounted /sys, which is the host in most sandboxes.
    with open("/proc/self/net/dev") as f:
        names = sorted(line.split(":")[0].strip() for line in f if ":" in line)
    return done("interfaces: " + ", ".join(names), names=names)


def op_routes(b: Battery, a: Result, _: Report) -> Result:
    default = 0
    for path, dest_col, zero in (("/proc/self/net/route", 1, "00000000"),
                                 ("/proc/self/net/ipv6_route", 0, "0" * 32)):
        try:
            with open(path) as f:
                rows = [line.split() for line in f]
        except OSError:
            continue
        default += sum(1 for r in rows if len(r) > dest_col and r[dest_col] == zero
                       and r[0] != "Iface" and not (dest_col == 0 and r[-1] == "lo"))
    return done(f"{default} default routes", count=default)


def op_socket(b: Battery, a: Result, _: Report) -> Result:
    s = socket.socket(a["family"], a["type"], a.get("proto", 0))
    s.close()
    return done("created the socket (nothing was sent)")


def op_proxy(b: Battery, a: Result, _: Report) -> Result:
    """Ask the environment's HTTP proxy, if it is on loopback, to tunnel to ``a["target"]``."""
    names = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    url = next((os.environ[n] for n in names if os.environ.get(n)), None)
    if url is None:
        return refused("no proxy in the environment")
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    host, port = parts.hostname or "", parts.port or 80
    if parts.scheme != "http":
        return refused(f"the proxy is {parts.scheme}://, not plain HTTP: not contacted")
    if host not in ("localhost", "::1") and not host.startswith("127."):
        return refused(f"the proxy {host} is not on loopback: not contacted")
    with socket.create_connection((host, port), timeout=3) as s:  # loopback only
        target = f"{a['target']}:{a['port']}"
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        status = s.recv(256).split(b"\r\n")[0].decode(errors="replace")
        tunnel = status.split(" ")[1:2] == ["200"]
        if tunnel:
            s.sendall(b"corral-probe\n")
    return {"ok": tunnel, "detail": f"the proxy answered {status[:80]!r}"}


# --- privilege ----------------------------------------------------------------------------

def op_status(b: Battery, a: Result, _: Report) -> Result:
    """The capability, no_new_privs and seccomp lines of /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _sep, value = line.partition(":")
            if key.startswith("Cap") or key in ("NoNewPrivs", "Seccomp"):
                fields[key] = value.strip()
    return done(f"uid {os.getuid()} inside", fields=fields)


def in_child(work: Callable[[Report], Any], report: Report | None = None,
             timeout: float = 30.0) -> Result:
    """Run ``work`` in a forked child, so that a kill or a changed namespace stays there.

    The child reports through a pipe; progress is passed on to ``report`` as it comes.
    Returns the child's last record and how it ended.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)

        def send(record: Result) -> None:
            os.write(w, (json.dumps(record) + "\n").encode())
        code = 0
        try:
            send({"result": work(send)})
        except OSError as e:
            send({"result": refused(why(e))})
        except BaseException as e:
            send({"result": {"ok": None, "detail": f"battery error: {e!r}"}})
            code = 1
        os._exit(code)
    os.close(w)
    last: Result = {}
    buffer, deadline = b"", time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(r, 65536) if ready else b""
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            record = json.loads(line)
            if "progress" in record and report is not None:
                report(record["progress"])
            last = record
    os.close(r)
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if "result" in last:
        return dict(last["result"], ended=ended(status))
    return {"ok": False, "detail": f"the attempt was stopped ({ended(status)})",
            "count": last.get("progress", 0), "ended": ended(status)}


def ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def op_userns(b: Battery, a: Result, _: Report) -> Result:
    def work(_: Report) -> Result:
        check(libc().unshare(CLONE_NEWUSER))
        return done("created a user namespace")
    return in_child(work)


def op_mount(b: Battery, a: Result, _: Report) -> Result:
    # In a mount namespace of the child's own, made private first: even where the
    # attempt succeeds (no sandbox at all, as root), the host's mounts are untouched.
    def work(_: Report) -> Result:
        lib = libc()
        check(lib.unshare(CLONE_NEWNS))
        check(lib.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None))
        check(lib.mount(b"tmpfs", b".", b"tmpfs", ctypes.c_ulong(0), b"size=1m"))
        return done("mounted a tmpfs")
    return in_child(work)


def op_ptrace_pid1(b: Battery, a: Result, _: Report) -> Result:
    if os.stat("/proc/self/ns/pid").st_ino == int(a["host_pidns"]):
        return done("no PID namespace: PID 1 is the host's init (not touched)", shared=True)

    def work(_: Report) -> Result:
        # PTRACE_SEIZE does not stop the tracee; the child's exit detaches it.
        check(libc().ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(1), None, None))
        return done("attached to PID 1 with ptrace")
    return in_child(work)


def op_tiocsti(b: Battery, a: Result, _: Report) -> Result:
    import fcntl
    import termios
    tried = []
    try:
        fds = [os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)]
    except OSError as e:
        tried.append(f"/dev/tty: {why(e)}")
        fds = []
    for fd in [*fds, 0, 1, 2]:
        if not os.isatty(fd):
            continue
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, b"#")  # never a newline: nothing would run
            return done(f"pushed a character into terminal input (fd {fd})")
        except OSError as e:
            tried.append(f"fd {fd}: {why(e)}")
    return refused("; ".join(tried) or "no terminal")


def op_syscall(b: Battery, a: Result, _: Report) -> Result:
    name = a["call"]
    if name == "keyctl":
        args: list[Any] = [ctypes.c_long(KEYCTL_GET_KEYRING_ID),
                           ctypes.c_long(KEY_SPEC_SESSION_KEYRING), ctypes.c_long(0)]
    elif name == "bpf":  # BPF_MAP_CREATE of a one-entry array
        attr = ctypes.create_string_buffer(
            (2).to_bytes(4, "little") + (4).to_bytes(4, "little") * 2 + (1).to_bytes(4, "little"),
            64)
        args = [ctypes.c_long(0), attr, ctypes.c_long(64)]
    elif name == "io_uring_setup":
        args = [ctypes.c_long(1), ctypes.create_string_buffer(120)]
    elif name == "perf_event_open":  # a disabled software clock on this process, user only
        attr = ctypes.create_string_buffer(
            (1).to_bytes(4, "little") + (64).to_bytes(4, "little") + bytes(32)
            + ((1 << 0) | (1 << 5) | (1 << 6)).to_bytes(8, "little"), 64)
        args = [attr, ctypes.c_long(0), ctypes.c_long(-1), ctypes.c_long(-1), ctypes.c_long(8)]
    elif name == "userfaultfd":  # O_CLOEXEC | UFFD_USER_MODE_ONLY
        args = [ctypes.c_long(0o2000000 | 1)]
    else:
        raise RuntimeError(f"unknown call {name}")
    result = syscall(name, *args)
    if name != "keyctl":
        os.close(result)
    return done(f"{name} succeeded")


# --- resources (bounded, each in a child that volunteers for the OOM killer) --------------

def bounded(work: Callable[[Report], Result], report: Report) -> Result:
    def child(progress: Report) -> Result:
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        return work(progress)
    return in_child(child, report)


def raise_soft(limit: int, want: int) -> None:
    """An attacker first raises its soft limits to the hard ones: only hard limits count."""
    soft, hard = resource.getrlimit(limit)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(limit, (target, hard))


def op_fork(b: Battery, a: Result, report: Report) -> Result:
    def work(progress: Report) -> Result:
        raise_soft(resource.RLIMIT_NPROC, a["bound"] + 64)
        hold_r, hold_w = os.pipe()
        count, stop = 0, "reached the bound"
        while count < a["bound"]:
            try:
                pid = os.fork()
            except OSError as e:
                stop = why(e)
                break
            if pid == 0:
                os.close(hold_w)
                os.read(hold_r, 1)
                os._exit(0)
            count += 1
            if count % 64 == 0:
                progress({"progress": count})
        os.close(hold_w)
        return {"ok": count >= a["bound"], "detail": f"{count} processes: {stop}", "count": count}
    return bounded(work, report)


def op_memory(b: Battery, a: Result, report: Report) -> Result:
    def work(progress: Report) -> Result:
        chunks, total = [], 0
        try:
            while total < a["bound"]:
                chunk = bytearray(16 << 20)
                chunk[::4096] = b"\1" * (len(chunk) // 4096)  # touch every page
                chunks.append(chunk)
                total += len(chunk)
                progress({"progress": total})
        except MemoryError:
            return refused(f"MemoryError after {total >> 20} MiB", count=total)
        return done(f"allocated {total >> 20} MiB", count=total)
    return bounded(work, report)


def op_fill(b: Battery, a: Result, report: Report) -> Result:
    path = a["path"]

    def work(progress: Report) -> Result:
        raise_soft(resource.RLIMIT_FSIZE, a["bound"] + CHUNK)
        total, block = 0, b"\0" * CHUNK
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                while total < a["bound"]:
                    total += os.write(fd, block)
                    progress({"progress": total})
            finally:
                os.close(fd)
        except OSError as e:
            return refused(f"{why(e)} after {total >> 20} MiB", count=total)
        return done(f"wrote {total >> 20} MiB", count=total)
    try:
        return bounded(work, report)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def op_nofile(b: Battery, a: Result, report: Report) -> Result:
    def work(progress: Report) -> Result:
        raise_soft(resource.RLIMIT_NOFILE, a["bound"] + 64)
        count = 0
        try:
            while count < a["bound"]:
                os.dup(2)  # needs no file: some sandboxes make /dev/null unusable
                count += 1
        except OSError as e:
            return refused(f"{why(e)} after {count} files", count=count)
        return done(f"opened {count} files", count=count)
    return bounded(work, report)


def op_fsize(b: Battery, a: Result, report: Report) -> Result:
    path = a["path"]

    def work(progress: Report) -> Result:
        raise_soft(resource.RLIMIT_FSIZE, a["bound"] + 1)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:  # sparse: one byte at the bound, no disk space used
            os.pwrite(fd, b"x", a["bound"])
        except OSError as e:
            return refused(why(e), count=0)
        finally:
            os.close(fd)
        return done(f"a {a['bound'] + 1}-byte file", count=a["bound"] + 1)
    try:
        return bounded(work, report)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


# --- lifecycle ------------------------------------------------------------------------------

def detach(marker: str, code: str, seconds: float, ready: int) -> None:
    """Become a program whose command line carries ``marker``, cut off from our pipes.

    ``ready`` closes on exec, which tells the battery that the marker is in place.
    """
    try:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # as an escaping program would
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, ready)
        os.closerange(ready + 1, 65536)
        os.set_inheritable(ready, False)
        os.execv(sys.executable, [sys.executable, "-c", code, marker, str(seconds)])
    finally:
        os._exit(127)


def spawn(start: Callable[[int], None]) -> int:
    """Fork ``start(ready)`` and wait until it has exec'd (or given up); returns its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        start(w)
        os._exit(127)
    os.close(w)
    select.select([r], [], [], 10)
    os.close(r)
    return pid


def op_daemon(b: Battery, a: Result, _: Report) -> Result:
    def start(ready: int) -> None:
        os.setsid()
        if os.fork() == 0:
            detach("-".join(a["marker"]), SLEEPER, a["seconds"], ready)
        os._exit(0)
    os.waitpid(spawn(start), 0)
    return done("started a daemon (double fork, new session)")


def op_orphan(b: Battery, a: Result, _: Report) -> Result:
    def start(ready: int) -> None:
        libc().prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
        detach("-".join(a["marker"]), SLEEPER, a["seconds"], ready)
    spawn(start)
    return done("started a child that cleared its parent-death signal")


def op_spin(b: Battery, a: Result, _: Report) -> Result:
    """Two spinning children, then the battery itself becomes a spinner (the launch's last
    attempt): all three carry markers, and only a spinner left alone prints its result."""
    marker = "-".join(a["marker"])
    for _i in range(2):
        spawn(lambda ready: detach(marker + "-child", SPINNER, a["seconds"], ready))
    final = done(f"spun for {a['seconds']} s: nothing stopped it", id=a["id"])
    os.execv(sys.executable, [sys.executable, "-c", SPINNER, marker + "-main",
                              str(a["seconds"]), TAG + " " + json.dumps(final)])


OPS: dict[str, Callable[[Battery, Result, Report], Result]] = {
    "append": op_append, "create": op_create, "chmod": op_chmod, "delete": op_delete,
    "mkfifo": op_mkfifo, "setid": op_setid,
    "rename": op_rename, "read": op_read, "list": op_list, "environ": op_environ,
    "proc": op_proc, "keyring": op_keyring, "fds": op_fds, "tcp": op_tcp, "udp": op_udp,
    "unix": op_unix, "unix-dgram": op_unix_dgram, "interfaces": op_interfaces,
    "routes": op_routes, "socket": op_socket,
    "proxy": op_proxy, "status": op_status, "userns": op_userns, "mount": op_mount,
    "ptrace-pid1": op_ptrace_pid1, "tiocsti": op_tiocsti, "syscall": op_syscall,
    "fork": op_fork, "memory": op_memory, "fill": op_fill, "nofile": op_nofile,
    "fsize": op_fsize, "daemon": op_daemon, "orphan": op_orphan, "spin": op_spin,
}


def main() -> None:
    cfg = json.loads(sys.argv[2])
    emit({"launch": sys.argv[1], "pid": os.getpid()})
    Battery(cfg).run(cfg["attempts"])
    emit({"launch": sys.argv[1], "done": True})
    sys.exit(cfg.get("exit", 0))


if __name__ == "__main__":
    main()
