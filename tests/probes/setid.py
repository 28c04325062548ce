"""Run inside a sandbox: try to leave set-uid and set-gid files in the working directory.

Every call that can carry the bits is tried: the chmod family, and creation
with a mode (open, openat, creat with O_CREAT, O_TMPFILE, mknod, mknodat;
mkdir too, which the kernel strips itself).  Prints {name: mode} for what was
made (its permission bits, octal) or {name: errno} when the call failed.
x86_64 numbers for the calls Python does not wrap.
"""

import ctypes
import json
import os
import stat

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
SETID = 0o6755
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000


def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *(L(a) if isinstance(a, int) else a for a in args))
    if r < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return r


def plain(name):
    with open(name, "w"):
        pass
    return name


def tmpfile(name):
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, SETID)
    try:
        raw(265, fd, b"", AT_FDCWD, name.encode(), AT_EMPTY_PATH)  # linkat
    finally:
        os.close(fd)


ATTEMPTS = {
    "chmod": lambda n: raw(90, plain(n).encode(), SETID),
    "fchmod": lambda n: os.fchmod(os.open(plain(n), os.O_RDONLY), SETID),
    "fchmodat": lambda n: raw(268, AT_FDCWD, plain(n).encode(), SETID),
    "fchmodat2": lambda n: raw(452, AT_FDCWD, plain(n).encode(), SETID, 0),
    "open(O_CREAT)": lambda n: os.close(raw(2, n.encode(), os.O_CREAT | os.O_WRONLY, SETID)),
    "openat(O_CREAT)": lambda n: os.close(os.open(n, os.O_CREAT | os.O_WRONLY, SETID)),
    "creat": lambda n: os.close(raw(85, n.encode(), SETID)),
    "openat(O_TMPFILE)": tmpfile,
    "mknod(S_IFREG)": lambda n: raw(133, n.encode(), stat.S_IFREG | SETID, 0),
    "mknodat(S_IFIFO)": lambda n: os.mknod(n, stat.S_IFIFO | SETID),
    "mkdir": lambda n: os.mkdir(n, SETID),
    "chmod 0750": lambda n: os.chmod(plain(n), 0o750),  # everyday modes keep working
}


def main():
    os.umask(0o022)
    out = {}
    for i, (name, attempt) in enumerate(ATTEMPTS.items()):
        path = f"setid-{i}"
        try:
            attempt(path)
            out[name] = oct(stat.S_IMODE(os.lstat(path).st_mode))
        except OSError as e:
            out[name] = e.errno
    print(json.dumps(out))


main()
