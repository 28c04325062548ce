"""Run inside a sandbox: use a pseudo-terminal the way programs do, then try what they must not.

Makes a pty (openpty: TIOCGPTN, TIOCSPTLCK), sets it raw (TCGETS, TCSETSF),
sets and reads its window size, drains and flushes it, and runs ``stty size``
on it as a child's controlling terminal (setsid, TIOCSCTTY, TIOCGPGRP).  Then
the requests no program needs: TIOCSETD (N_NULL: a dead terminal), TCXONC
(output stopped), TIOCEXCL (locked).  Prints {name: result-or-errno}.
"""

import fcntl
import json
import os
import pty
import struct
import termios
import tty

N_NULL, TCOOFF = 27, 0
TIOCSETD, TCXONC, TIOCEXCL = 0x5423, 0x540A, 0x540C


def attempt(out, name, work):
    try:
        out[name] = work()
    except OSError as e:
        out[name] = e.errno


def stty_size():
    pid, fd = pty.fork()
    if pid == 0:
        os.execv("/bin/stty", ["stty", "size"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    data = b""
    while True:
        try:
            chunk = os.read(fd, 100)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    return data.decode().split()


def main():
    out = {}
    master, slave = os.openpty()
    attempt(out, "raw", lambda: tty.setraw(slave) or "ok")
    attempt(out, "winsize", lambda: list(struct.unpack("HHHH", fcntl.ioctl(
        slave, termios.TIOCGWINSZ, fcntl.ioctl(master, termios.TIOCSWINSZ,
                                               struct.pack("HHHH", 24, 80, 0, 0))))[:2]))
    attempt(out, "drain", lambda: termios.tcdrain(slave) or termios.tcflush(
        slave, termios.TCIFLUSH) or "ok")
    attempt(out, "stty", stty_size)
    attempt(out, "TCXONC", lambda: (fcntl.ioctl(slave, TCXONC, TCOOFF) and "done") or "done")
    attempt(out, "TIOCEXCL", lambda: (fcntl.ioctl(slave, TIOCEXCL) and "done") or "done")
    attempt(out, "TIOCSETD", lambda: fcntl.ioctl(slave, TIOCSETD, struct.pack("i", N_NULL))
            and "done")  # last: the line discipline it sets ends the terminal's use
    print(json.dumps(out))


main()
