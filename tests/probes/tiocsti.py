"""Run inside a sandbox: push a keystroke into a fresh terminal with TIOCSTI.

argv[1] is the ioctl request (TIOCSTI, perhaps with high bits set: the kernel
reads only the low 32).  Prints {"rc": ..., "errno": ..., "read": ...}.
"""

import ctypes
import fcntl
import json
import os
import sys
import termios
import tty

libc = ctypes.CDLL(None, use_errno=True)
request = int(sys.argv[1], 0)
master, slave = os.openpty()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()  # a new session, so the pty can become this process's controlling terminal
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    tty.setraw(slave)
    ctypes.set_errno(0)
    rc = libc.ioctl(slave, ctypes.c_ulong(request), ctypes.c_char_p(b"Z"))
    err = ctypes.get_errno()
    got = os.read(slave, 1).decode() if rc == 0 else ""
    os.write(w, json.dumps({"rc": rc, "errno": err, "read": got}).encode())
    os._exit(0)
os.close(w)
print(os.read(r, 4096).decode())
os.waitpid(pid, 0)
