"""The disk measure and its watcher (corral.diskuse, corral.watch): real files and real
processes, no sandbox; tests/test_disk.py runs the same attacks in real sandboxes."""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity
from corral import diskuse
from corral.diskuse import BLOCK, MAX_DEPTH, Unmeasurable, measure
from corral.watch import Watch


def test_measure_counts_each_inode_once_and_every_entry_at_least_a_block(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "a", tmp_path / "hard")
    (tmp_path / "link").symlink_to("/usr")  # never followed
    for i in range(10):
        (tmp_path / f"empty{i}").touch()
    (tmp_path / "d" / "e").mkdir(parents=True)
    use = measure(str(tmp_path))
    a_blocks = os.stat(tmp_path / "a").st_blocks * 512
    assert use.bytes == a_blocks + BLOCK * (1 + 10 + 2)  # symlink, empty files, two dirs


def test_measure_stops_early_once_over(tmp_path: Path) -> None:
    for i in range(100):
        (tmp_path / f"f{i}").touch()
    use = measure(str(tmp_path), stop_at=10 * BLOCK)
    assert not use.complete and use.bytes == 11 * BLOCK


def test_measure_counts_open_deleted_files_of_given_processes(tmp_path: Path) -> None:
    with open(tmp_path / "gone", "wb") as f:
        f.write(b"y" * 1_000_000)
        f.flush()
        os.unlink(tmp_path / "gone")
        assert measure(str(tmp_path)).bytes == 0  # control: the walk alone misses it
        assert measure(str(tmp_path), pids=[os.getpid()]).bytes >= 1_000_000


def test_measure_refuses_what_it_cannot_see(tmp_path: Path) -> None:
    deep = tmp_path
    for _ in range(MAX_DEPTH + 1):
        deep = deep / "d"
    deep.mkdir(parents=True)
    with pytest.raises(Unmeasurable):
        measure(str(tmp_path))


def _verdict_within(watch: Watch, seconds: float) -> str | None:
    fd = watch.fileno()
    assert fd is not None
    ready, _, _ = select.select([fd], [], [], seconds)
    return watch.verdict() if ready else None


def test_watch_reports_disk_over_the_limit_from_its_thread(tmp_path: Path) -> None:
    watch = Watch(workspace=str(tmp_path), disk_bytes=1 << 20, cpu_s=None)
    (tmp_path / "before").write_bytes(b"z" * (4 << 20))  # the limit is on what is added
    watch.start()
    try:
        assert _verdict_within(watch, 0.5) is None  # control: nothing added yet
        (tmp_path / "after").write_bytes(b"z" * (2 << 20))
        assert _verdict_within(watch, 30) == "disk-limit"
    finally:
        watch.stop()
    assert watch.describe()["limit_hit"] == "disk"
    assert watch.describe()["workspace_bytes_added_is"] == "at least"  # it stopped counting


def test_watch_ends_a_run_over_its_cpu_time() -> None:
    used = [0.5]
    watch = Watch(workspace="/", disk_bytes=None, cpu_s=1.0, cpu_used=lambda: used[0])
    watch.start()
    watch.next_cpu = 0
    assert watch.check() is None
    used[0] = 1.2
    watch.next_cpu = 0
    assert watch.check() == "timeout" and watch.limit_hit == "cpu"
    # The last look after the run: the cgroup's final count (review 41).
    late = Watch(workspace="/", disk_bytes=None, cpu_s=1.0, cpu_used=lambda: 0.0)
    assert late.finish(0.9) is None and late.finish(1.3) == "timeout"
    assert late.limit_hit == "cpu" and "1.30s" in late.note
    assert Watch(workspace="/", disk_bytes=None, cpu_s=None).finish(5.0) is None
    # Without a cgroup to read, there is no CPU-time watch (and the policy was refused).
    assert Watch(workspace="/", disk_bytes=None, cpu_s=1.0).due() is None


def test_a_locked_directory_is_reopened_or_refused(tmp_path: Path) -> None:
    locked = tmp_path / "d"
    locked.mkdir()
    (locked / "f").write_bytes(b"q" * 100_000)
    locked.chmod(0)
    try:
        if os.geteuid() == 0:
            assert measure(str(tmp_path)).bytes > 100_000  # root reads it regardless
            return
        with pytest.raises(Unmeasurable):
            measure(str(tmp_path))  # control: a plain user cannot read it as it is
        assert measure(str(tmp_path), restore=True).bytes > 100_000
        assert locked.stat().st_mode & 0o700 == 0o700
    finally:
        locked.chmod(0o700)


def test_a_directory_without_search_rights_is_restored_or_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_bytes(b"q" * 100_000)
    (ws / "d").chmod(0o600)  # readable, not searchable: entries cannot be stat'ed
    ws.chmod(0o500)
    try:
        if os.geteuid() == 0:
            assert measure(str(ws)).bytes > 100_000
            return
        assert measure(str(ws), restore=True).bytes > 100_000
        assert ws.stat().st_mode & 0o700 == 0o700 and (ws / "d").stat().st_mode & 0o700 == 0o700
    finally:
        ws.chmod(0o700)
        (ws / "d").chmod(0o700)


def _json_as(who: Identity, script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` with ``args`` in Python as ``who``; what it prints, as JSON."""
    r = subprocess.run([*who.prefix(), "-c", script, *args], env=who.environ(), cwd=who.tmp,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


SEARCH_TAKEN = r"""
import json, os, sys
from corral import diskuse
d = os.path.join(sys.argv[1], "x")
os.mkdir(d)
with open(os.path.join(d, "f"), "w") as f:
    f.write("q")
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)  # opened, and its rights checked: 0755
os.chmod(d, 0)  # then taken away, as a payload racing the watcher does
out = {}
try:
    diskuse._stat("f", fd, False)
    out["plain"] = "read"
except PermissionError:
    out["plain"] = "refused"
diskuse._stat("f", fd, True)
out["mode"] = os.stat(d).st_mode & 0o777
print(json.dumps(out))
"""


def test_search_taken_away_after_the_open_is_given_back(who: Identity) -> None:
    """A payload that takes a directory's search right away between the watcher's open
    (rights checked) and its look at an entry: the entry is still measured (the rights
    come back, as for a directory locked before); control: without ``restore`` the look
    is refused, which made the run unmeasurable and stopped it (a false disk-limit)."""
    out = _json_as(who, SEARCH_TAKEN, str(who.tmp))
    if who.is_root:  # root looks regardless: nothing to give back
        assert out == {"plain": "read", "mode": 0}, out
    else:
        assert out == {"plain": "refused", "mode": 0o700}, out


SEARCH_TAKEN_ABOVE = r"""
import json, os, sys
from corral import diskuse
d = os.path.join(sys.argv[1], "y")
os.makedirs(os.path.join(d, "sub"))
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)  # opened, and its rights checked: 0755
os.chmod(d, 0)  # then taken away before the walk enters the folder inside
out = {}
for restore in (False, True):
    try:
        os.close(diskuse._open_dir("sub", fd, restore))
        out[str(restore)] = "entered"
    except diskuse.Unmeasurable:
        out[str(restore)] = "refused"
out["mode"] = os.stat(d).st_mode & 0o777
print(json.dumps(out))
"""


def test_search_taken_away_above_a_folder_is_given_back(who: Identity) -> None:
    """The same race one level down: the search right of a folder the walk has open, taken
    away before the walk enters a folder inside it.  The folder was then unmeasurable and
    the run stopped as over its disk limit (a known limit till now); with ``restore`` the
    parent's right comes back and the folder is entered.  Control: without, refused."""
    out = _json_as(who, SEARCH_TAKEN_ABOVE, str(who.tmp))
    if who.is_root:  # root enters regardless: nothing to give back
        assert out == {"False": "entered", "True": "entered", "mode": 0}, out
    else:
        assert out == {"False": "refused", "True": "entered", "mode": 0o700}, out


LOW_CHILD = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"x" * (4 << 20))
at = libc.mmap(0x1000000, 4 << 20, 1, 1 | 0x100000, fd, 0)  # MAP_SHARED|FIXED_NOREPLACE
assert at == 0x1000000, (at, ctypes.get_errno())
os.unlink(sys.argv[1])
os.close(fd)  # the mapping alone holds it, below 0x10000000
print("ready", flush=True)
time.sleep(60)
"""

LOW_MAPPED = r"""
import json, os, subprocess, sys
from corral import diskuse
ws, code = sys.argv[1], sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", code, ws + "/low"], stdout=subprocess.PIPE,
                         text=True)
try:
    assert child.stdout.readline() == "ready\n"
    line = next(l for l in open(f"/proc/{child.pid}/maps") if l.endswith("(deleted)\n"))
    padded = line.split()[0]
    out = {"padded": padded}
    try:  # the name as maps prints it, which the old measure stat'ed
        os.stat(f"/proc/{child.pid}/map_files/{padded}")
        out["padded_stat"] = "ok"
    except OSError as e:
        out["padded_stat"] = e.strerror
    try:
        out["measured"] = diskuse.measure(ws, pids=[child.pid]).bytes >> 20
    except diskuse.Unmeasurable as e:
        out["measured"] = str(e)
    print(json.dumps(out))
finally:
    child.kill()
    child.wait()
"""


def test_a_file_mapped_below_0x10000000_is_sized(who: Identity) -> None:
    """Review 13: /proc/PID/maps pads an address to 8 hex digits, map_files names take no
    leading zero, so a file mapped alone below 0x10000000 had a name root's measure could
    not stat, and was skipped: 70 MiB held under --disk 16M, the run `exited`.  The name
    is made from the numbers now: root sizes the file, a plain user's measure refuses it.
    Control: the padded name, as maps prints it, cannot be stat'ed."""
    ws = who.tmp / "lowws"
    ws.mkdir()
    who.chown(ws)
    out = _json_as(who, LOW_MAPPED, str(ws), LOW_CHILD)
    assert out["padded"].startswith("01000000-"), out
    if who.is_root:
        assert out["padded_stat"] == "No such file or directory", out  # the control
        assert out["measured"] >= 4, out
    else:  # a plain user may not stat map_files at all: refused, whatever the name
        assert "whose size only root may read" in str(out["measured"]), out


MAPPED_CHILD = r"""
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"x" * (5 << 20))
m = mmap.mmap(fd, 4096)  # Python's mmap keeps a duplicate of the descriptor
os.unlink(sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""

MAPPED_THEN_GONE = r"""
import json, subprocess, sys
from corral import diskuse
ws, child_code = sys.argv[1], sys.argv[2]
out, firsts, calls = {}, [], []
held, reread = diskuse._count_held, diskuse._mapped_deleted


def exits_first(pids, *args):  # the child exits between the mappings' and descriptors' reads
    if not firsts:
        firsts.append(child)
        child.kill()
        child.wait()
    return held(pids, *args)


def first_read_only(pids, *args):  # control: the mappings as the first read saw them
    calls.append(reread(pids, *args))
    return calls[0]


def measure(name):
    global child
    child = subprocess.Popen([sys.executable, "-c", child_code, ws + "/m"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    firsts.clear()
    calls.clear()
    try:
        use = diskuse.measure(ws, pids=lambda: [] if child.poll() is not None else [child.pid])
        out[name] = use.bytes >> 20
    except diskuse.Unmeasurable as e:
        out[name] = str(e)


diskuse._count_held = exits_first
measure("exited")
diskuse._mapped_deleted = first_read_only
measure("control")
print(json.dumps(out))
"""


def test_a_process_that_exits_between_the_reads_is_not_taken_for_hiding_files(
        who: Identity) -> None:
    """A file mapped, its descriptor kept, by a process that exits between the measure's
    read of the mappings and its read of the descriptors (the kernel unmaps before it
    closes them): seen mapped, then held by no descriptor, it was taken for a file hidden
    behind a mapping, which a plain user's launcher cannot size, and the run was stopped
    (CI: a false disk-limit).  The mappings are read again before that verdict; control:
    judged on the first read alone, the plain user's measure refuses."""
    ws = who.tmp / "mapws"
    ws.mkdir()
    who.chown(ws)
    out = _json_as(who, MAPPED_THEN_GONE, str(ws), MAPPED_CHILD)
    assert out["exited"] == 0, out
    if who.is_root:  # root sizes what a mapping holds, here nothing: no verdict to refuse
        assert out["control"] == 0, out
    else:
        assert "whose size only root may read" in str(out["control"]), out


# -- the disk measure against descriptor tricks and floods (real processes, no sandbox) ----

HOLD = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
path, trick = sys.argv[1], sys.argv[2]

def hold():
    if trick == "clone-files":
        if libc.unshare(0x400) != 0:  # CLONE_FILES: a descriptor table of its own
            os._exit(3)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink(path)
    os.write(fd, b"h" * (4 << 20))
    print("ready", flush=True)
    time.sleep(60)

thread = threading.Thread(target=hold)
thread.start()
if trick == "exit-leader":
    time.sleep(0.5)
    libc.syscall(SYS_EXIT, 0)  # only the leader thread ends
thread.join()
""".replace("SYS_EXIT", str({"x86_64": 60, "aarch64": 93}[__import__("platform").machine()]))


def _held_by_leader(pid: int) -> int:
    """What the old check read: regular deleted files in /proc/PID/fd."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        st = os.stat(f"/proc/{pid}/fd/{fd}")
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 0:
            total += st.st_size
    return total


@pytest.mark.parametrize("trick", ["clone-files", "exit-leader"])
def test_files_held_by_any_thread_are_counted(tmp_path: Path, trick: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(ws / "held"), trick],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(1)  # the leader has called SYS_exit by now
        assert measure(str(ws), pids=[proc.pid]).bytes >= 4 << 20
        assert _held_by_leader(proc.pid) == 0  # control: the leader's table shows nothing
    finally:
        proc.kill()
        proc.communicate()


def test_a_huge_directory_is_read_in_chunks(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "f").touch()
    for i in range(60_000):
        os.link(big / "f", big / f"link-with-a-longish-name-{i}")
    tracemalloc.start()
    try:
        assert measure(str(tmp_path)).entries == 60_002
        walked = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        os.listdir(big)  # control: what the old walk did, one list of every name
        listed = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert walked < (1 << 20) < listed, (walked, listed)


def test_each_measurement_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").touch()
        os.link(tmp_path / f"f{i}", tmp_path / f"g{i}")
    assert measure(str(tmp_path)).complete  # control: within the bounds, measured
    monkeypatch.setattr(diskuse, "MAX_LINKED", 10)
    with pytest.raises(Unmeasurable, match="hard links"):
        measure(str(tmp_path))
    monkeypatch.setattr(diskuse, "MAX_LINKED", 1000)
    monkeypatch.setattr(diskuse, "TICK", 8)
    monkeypatch.setattr(diskuse, "MAX_ENTRIES", 40)
    with pytest.raises(Unmeasurable, match="more than 40 entries"):
        measure(str(tmp_path))
