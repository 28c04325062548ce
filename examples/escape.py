"""An "agent-written" script that tries to get out.  Run it with:

    corral run --input examples/escape.py -- python3 escape.py

Each attempt prints BLOCKED or ESCAPED.  Nothing here sends traffic anywhere:
the name lookup stays inside the sandbox's own network namespace.
"""

import ctypes
import os
import socket

libc = ctypes.CDLL(None, use_errno=True)


def attempt(what, action, allowed=False):
    try:
        detail = action()
        print(f"{'ALLOWED' if allowed else 'ESCAPED'}  {what}: {detail}")
    except OSError as e:
        print(f"BLOCKED  {what}: {e.strerror or e}")


def write(path):
    with open(path, "w") as f:
        f.write("pwned\n")
    return f"wrote {path}"


def read(path):
    with open(path) as f:
        return f"read {len(f.read())} bytes of {path}"


def listdir(path):
    return f"{path} holds {os.listdir(path)[:5]}"


def libc_call(name, *args):
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return f"{name} succeeded"


attempt("write to /etc", lambda: write("/etc/corral-demo"))
attempt("write to /usr/bin", lambda: write("/usr/bin/corral-demo"))
attempt("write to /root/.bashrc", lambda: write("/root/.bashrc"))
attempt("read /etc/shadow", lambda: read("/etc/shadow"))
attempt("list /root", lambda: listdir("/root/.ssh"))
attempt("list /home", lambda: listdir("/home"))
attempt("trace PID 1", lambda: libc_call("ptrace", 0x4206, 1, None, None))  # PTRACE_SEIZE
attempt("create a user namespace", lambda: libc_call("unshare", 0x10000000))  # CLONE_NEWUSER
attempt("resolve example.com", lambda: str(socket.getaddrinfo("example.com", 443)[0][4]))
attempt("write to /work, the workspace", lambda: write("/work/allowed.txt"), allowed=True)
print(f"running as uid {os.getuid()} with HOME={os.environ.get('HOME')}")
