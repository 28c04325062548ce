"""Red-team findings against the disk limit and the copy-out of a workspace image, each
reproduced against the real launcher, with its control.  Real bwrap, real cgroups, as root
and as a plain user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity

pytestmark = [pytest.mark.sandbox]
MiB = 1 << 20

# Directories whose blocks stay allocated after they are emptied (ext4 never shrinks a
# directory), then removed while the payload holds them: by a descriptor, or as the
# working directory of a process.  ``file``: the same space as deleted regular files.
HIDE_DIRS = r"""
import os, sys, time
rounds, how = int(sys.argv[1]), sys.argv[2]
os.close(os.open("/work/one", os.O_CREAT | os.O_WRONLY, 0o600))
held, hidden = [], 0
for r in range(rounds):
    d = f"/work/d{r}"
    if how == "file":
        fd = os.open(d, os.O_CREAT | os.O_WRONLY, 0o600)
        os.write(fd, b"x" * (10 << 20))
        os.unlink(d)
    else:
        os.mkdir(d)
        for i in range(32000):  # about 10 MiB of directory blocks
            os.link("/work/one", f"{d}/{i:0200d}")
        for i in range(32000):
            os.unlink(f"{d}/{i:0200d}")
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        if how == "cwd" and os.fork() == 0:
            os.chdir(d)
            time.sleep(3600)
        os.rmdir(d)
    hidden += os.fstat(fd).st_blocks * 512
    if how == "cwd":
        os.close(fd)  # only the child's working directory holds it now
    else:
        held.append(fd)
    time.sleep(0.5)  # the watcher looks at the workspace as it is now, several times
print("hidden", hidden >> 20, flush=True)
time.sleep(2)
"""


def _limits(result: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(result["record"]).read_text())["limits"]
    return data


@pytest.mark.parametrize("how", ["fd", "cwd"])
def test_deleted_directories_the_run_holds_count_toward_the_disk_limit(
        who: Identity, how: str) -> None:
    """A red-team run held 60 MiB under --disk 16M in the plain user's (measured)
    workspace: directories grown to 10 MiB of blocks, emptied and removed while a
    descriptor or a working directory held them; the measure counted only deleted regular
    files, so the run ended `exited`.  Now every deleted inode the run holds counts."""
    ws = who.tmp / "ws"  # measured, for root too: a reused workspace
    ws.mkdir()
    who.chown(ws)
    r = who.corral_json("--workspace", str(ws), "--disk", "16M", "--timeout", "120", "--",
                        "python3", "-c", HIDE_DIRS, "6", how)
    assert r["status"] == "disk-limit", (r["status"], r["stdout"], _limits(r))
    # Control: the same run under a limit that holds it all runs to the end, and says how
    # much it held (so the run above did build what it was stopped for).
    ws2 = who.tmp / "ws2"
    ws2.mkdir()
    who.chown(ws2)
    ok = who.corral_json("--workspace", str(ws2), "--disk", "400M", "--timeout", "120", "--",
                         "python3", "-c", HIDE_DIRS, "6", how)
    assert ok["status"] == "exited", ok
    assert int(ok["stdout"].split()[1]) >= 54, ok


def test_deleted_regular_files_were_already_counted(who: Identity) -> None:
    """The control of the class: the same space as deleted regular files was stopped
    before the fix too."""
    ws = who.tmp / "ws"
    ws.mkdir()
    who.chown(ws)
    r = who.corral_json("--workspace", str(ws), "--disk", "16M", "--timeout", "120", "--",
                        "python3", "-c", HIDE_DIRS, "6", "file")
    assert r["status"] == "disk-limit", r
