"""What the payload can learn of the host's activity through the kernel, as root and as the
test user, each refusal beside its control (the same sandbox without the filter).

The device nodes in the sandbox's ``/dev`` are bind mounts of the host's own (bwrap
``--dev``), so a watch on one is a watch on the host's inode: it reports what host
processes do with ``/dev/tty``, which is where password prompts, ``less`` and ``fzf`` read
keys from.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Identity
from layer_tools import give, without

pytestmark = pytest.mark.sandbox

# On the host: a program that, like a password prompt or fzf, reads its controlling
# terminal through /dev/tty one key at a time, while "keys" arrive every 0.2 s.
TYPIST = """\
import os, pty, sys, time, tty
pid, master = pty.fork()
if pid == 0:
    fd = os.open("/dev/tty", os.O_RDONLY)
    tty.setraw(fd)
    while os.read(fd, 1):
        pass
    os._exit(0)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    os.write(master, b"k")
    time.sleep(0.2)
"""

# In the sandbox: watch /dev/tty for reads; file watchers' own masks must keep working.
WATCH = """\
import ctypes, json, os, select, time
libc = ctypes.CDLL(None, use_errno=True)
IN_ACCESS, IN_ALL_EVENTS = 0x1, 0xFFF
WATCHERS = IN_ALL_EVENTS & ~IN_ACCESS  # watchdog, libuv, notify: modify, create, open...
def add(fd, path, mask):
    ctypes.set_errno(0)
    wd = libc.inotify_add_watch(fd, path.encode(), ctypes.c_uint32(mask))
    return wd, 0 if wd >= 0 else ctypes.get_errno()
fd = libc.inotify_init1(os.O_NONBLOCK)
out = {"watchers' mask on /work": add(fd, "/work", WATCHERS)[1],
       "all events on /dev/tty": add(fd, "/dev/tty", IN_ALL_EVENTS)[1]}
wd, out["reads of /dev/tty"] = add(fd, "/dev/tty", IN_ACCESS)
keys, deadline = 0, time.monotonic() + 60
while wd >= 0 and keys < 3 and time.monotonic() < deadline:
    if select.select([fd], [], [], 1)[0]:
        keys += len(os.read(fd, 4096)) // 16  # struct inotify_event, no name for a file
out["keys seen"] = keys
print(json.dumps(out))
"""


@pytest.fixture
def typist(tmp_path: Path) -> Iterator[None]:
    script = tmp_path / "typist.py"
    script.write_text(TYPIST)
    proc = subprocess.Popen([sys.executable, str(script), "300"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def test_host_keystrokes_on_dev_tty_stay_unseen(who: Identity, layers: Path,
                                                 typist: None) -> None:
    script = give(who, "watch.py", WATCH)
    r = who.corral_json("--input", str(script), "--", "python3", "watch.py")
    assert json.loads(r["stdout"]) == {
        "watchers' mask on /work": 0, "all events on /dev/tty": errno.EPERM,
        "reads of /dev/tty": errno.EPERM, "keys seen": 0}, r
    # Control: without the filter every key the host program reads is seen, with its time.
    ctl = json.loads(without(who, layers, ["seccomp"], "--input", str(script), "--",
                             "python3", "watch.py")["stdout"])
    assert ctl["reads of /dev/tty"] == 0 and ctl["keys seen"] >= 3, ctl
