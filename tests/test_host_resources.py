"""Host resources one run could take from everyone: open files, pseudo-terminals, and (cgroup
v1) memory beside separately counted socket buffers.

Real bwrap and real cgroups, as root and as a plain user.  Each protection runs
with its control: the same attempt under the old settings, or in a raw bwrap
or cgroup without the protection, goes past the bound.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_lab import Lab
from conftest import Identity, raw_bwrap

pytestmark = pytest.mark.sandbox
MiB = 1 << 20


def _file(who: Identity, name: str, text: str) -> Path:
    path = who.tmp / name
    path.write_text(text)
    if os.geteuid() == 0:
        os.chown(path, *who.owner)
    return path


def _record(result: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(result["record"]).read_text())
    return data


# -- open files ----------------------------------------------------------------------------

HOLD_FILES = r"""
import os, sys, time
r, w = os.pipe()
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        n = 0
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)  # a new open file each time, not a dup
                n += 1
        except OSError:
            pass
        os.write(w, b"%d\n" % n)
        time.sleep(60)  # hold them while the others count
total = 0
for _ in range(int(sys.argv[1])):
    line = b""
    while not line.endswith(b"\n"):
        line += os.read(r, 1)
    total += int(line)
print(total, flush=True)
"""


def test_one_run_holds_no_more_open_files_than_its_budget(who: Identity) -> None:
    script = str(_file(who, "files.py", HOLD_FILES))
    bounded = _file(who, "bounded.toml", "[limits]\npids = 64\nfiles = 8192\n")
    r = who.corral_json("--profile", str(bounded), "--input", script, "--", "python3",
                        "files.py", "60")
    assert r["exit_code"] == 0, r
    held = int(r["stdout"])
    assert 60 * 64 < held <= 8192, r  # every child got its share: 8192 // 67 = 122 each
    # Control: the old settings, 1024 files per process however many processes, let the
    # same run hold seven times the budget (an agent profile's 4096 x 1024 was more than
    # this machine's whole file table).
    old = _file(who, "old.toml", "[limits]\npids = 64\nfiles = 1000000\n")
    r = who.corral_json("--profile", str(old), "--input", script, "--", "python3",
                        "files.py", "60")
    assert int(r["stdout"]) > 7 * 8192, r


# -- pseudo-terminals ------------------------------------------------------------------------

OPEN_PTYS = r"""
import os, sys
held = []
try:
    while len(held) < int(sys.argv[1]):
        held.append(os.openpty())
    print(len(held), 0)
except OSError as e:
    print(len(held), e.errno)
"""


def _ptys(text: str) -> tuple[int, int]:
    opened, errno_ = text.split()
    return int(opened), int(errno_)


def test_a_run_opens_no_more_ptys_than_its_bound(who: Identity, bwrap: str) -> None:
    script = str(_file(who, "ptys.py", OPEN_PTYS))
    bounded = _file(who, "ptys.toml", "[limits]\nptys = 8\n")
    r = who.corral_json("--profile", str(bounded), "--input", script, "--", "python3",
                        "ptys.py", "40")
    assert _ptys(r["stdout"]) == (8, 28), r  # ENOSPC at the sandbox's own max=8
    assert _record(r)["limits"]["ptys"] == 8
    # By default a run has none at all: /dev/ptmx leads to an empty directory.
    none = who.corral_json("--input", script, "--", "python3", "ptys.py", "40")
    assert _ptys(none["stdout"]) == (0, 2), none
    # Control: bwrap's own devpts has no max=, and the same loop goes past the bound (it
    # stops at 24; every pty is closed as it exits).
    ctl = raw_bwrap(bwrap, ["--ro-bind", script, "/ptys.py"],
                    ["/usr/bin/python3", "/ptys.py", "24"])
    assert _ptys(ctl.stdout) == (24, 0), ctl


def test_agents_get_a_bounded_pool_of_ptys(who: Identity, lab: Lab) -> None:
    (lab.project / "ptys.py").write_text(OPEN_PTYS)
    lab.own(lab.project / "ptys.py")
    r = who.corral("shell", "-c", "python3 ptys.py 100", cwd=lab.project)
    assert r.returncode == 0 and _ptys(r.stdout) == (64, 28), r  # the profiles' ptys = 64


# -- memory and socket buffers: one budget (cgroup v1) ----------------------------------------

MEMORY_AND_SOCKETS = r"""
import socket, sys
block = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
server = socket.create_server(("127.0.0.1", 0))
pairs, held, goal = [], 0, int(sys.argv[2]) << 20
while held < goal and len(pairs) < 100:
    try:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    except OSError:
        break
    a.setblocking(False)
    pairs.append((a, b))
    before = held
    while held < goal:
        try:
            held += a.send(b"\0" * (1 << 16))
        except OSError:
            break
    if held == before:
        break  # the kernel buffers no more
print(len(block) >> 20, held >> 20, flush=True)
"""


def _control_cgroup(who: Identity, limits: dict[str, int]) -> Path:
    """A raw v1 memory cgroup with the old, separate limits (the user's in its delegation)."""
    base = Path(f"/sys/fs/cgroup/memory/corral/uid-{who.uid}")
    path = base / f"control-{uuid.uuid4().hex[:8]}"
    script = "mkdir " + str(path) + "".join(
        f" && echo {value} > {path}/memory.{name}" for name, value in limits.items())
    made = who.run(["/bin/sh", "-c", script])
    assert made.returncode == 0, made
    return path


def test_memory_and_socket_buffers_share_one_budget(who: Identity) -> None:
    script = str(_file(who, "both.py", MEMORY_AND_SOCKETS))
    r = who.corral_json("--memory", "200M", "--input", script, "--", "python3", "both.py",
                        "120", "120")
    words = r["stdout"].split()
    both = r["status"] == "exited" and len(words) == 2 and int(words[1]) >= 120
    assert not both, r  # oom, or the socket buffers refused: never 240 MiB under 200M
    assert r["status"] in ("exited", "oom"), r
    if r["status"] == "exited":
        assert int(words[0]) == 120 and int(words[1]) < 100, r  # memory fit; buffers stopped
        assert 120 * MiB < r["peak_memory_bytes"] <= 200 * MiB, r  # their sum, reported
    # Control: v1's old separate limits, 200M for memory and 200M for socket buffers, let
    # the same payload have both.
    limit = 200 * MiB
    ctl = _control_cgroup(who, {"limit_in_bytes": limit, "memsw.limit_in_bytes": limit,
                                "kmem.tcp.limit_in_bytes": limit})
    try:
        out = who.run(["/bin/sh", "-c", f"echo $$ > {ctl}/tasks && exec /usr/bin/python3 "
                       f"{script} 120 120"])
        assert out.stdout.split() == ["120", "120"], out
        charged = sum(int((ctl / f"memory.{name}max_usage_in_bytes").read_text())
                      for name in ("", "kmem.tcp."))
        assert charged > 240 * MiB  # over the budget, counted in two places
    finally:
        who.run(["/bin/sh", "-c", f"rmdir {ctl}"])
