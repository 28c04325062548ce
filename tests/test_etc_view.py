"""The run's /etc: a tmpfs remounted read-only, small host files copied in, the rest bound.

Copying instead of binding saves bwrap a mount and a re-read of /proc/self/mountinfo per
file (issue 12); these tests hold it to the same view: the same bytes, no wider
permissions, nothing writable, and anything the copy could show more of stays a bind.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from conftest import Identity, raw_bwrap, raw_bwrap_argv
from corral import fsops, resolve

COPIED = ("/etc/services", "/etc/protocols", "/etc/nsswitch.conf", "/etc/ld.so.cache")


def test_copied_files_show_the_hosts_bytes_and_no_wider_modes(who: Identity) -> None:
    present = [p for p in COPIED if os.path.isfile(p)]
    assert present, "this machine has none of the copied /etc files"
    script = "; ".join(f"stat -c '%a %n' {p}; sha256sum {p}" for p in present)
    r = who.corral_json("--", "/bin/sh", "-c", script)
    assert r["exit_code"] == 0, r
    for p in present:
        host = Path(p)
        assert f"{hashlib.sha256(host.read_bytes()).hexdigest()}  {p}" in r["stdout"]
        mode = int(next(line for line in r["stdout"].splitlines()
                        if line.endswith(" " + p)).split()[0], 8)
        assert mode & ~(host.stat().st_mode & 0o777) == 0, (p, oct(mode))
        assert mode & 0o222 == 0


def test_root_and_etc_are_read_only_at_the_mount(who: Identity, bwrap: str) -> None:
    """EROFS: the mount refuses the write before Landlock or the files' modes are asked
    (started by a plain user, / and /etc used to be that user's own directories on bwrap's
    writable root tmpfs, where only Landlock refused)."""
    script = ("for t in /etc/corral-x /etc/passwd /etc/services /etc/ssl/corral-x /corral-x "
              "/run/corral/x; do (echo pwn > $t) 2>&1; done; echo done")
    r = who.corral_json("--", "/bin/sh", "-c", script)
    assert r["exit_code"] == 0 and r["stdout"].endswith("done\n"), r
    assert r["stdout"].count("Read-only file system") == 6, r["stdout"]
    # Negative control: the same root without the seal takes the write.
    ctl = raw_bwrap(bwrap, ["--dir", "/etc"],
                    ["/bin/sh", "-c", "echo pwn > /etc/corral-x && cat /etc/corral-x"])
    assert ctl.returncode == 0 and ctl.stdout == "pwn\n", ctl.stderr


def test_dev_is_read_only_at_the_mount(who: Identity, bwrap: str) -> None:
    """bwrap's /dev tmpfs was the last scaffolding left writable at the mount: started by
    a plain user the payload's own directory, which it could chmod (Landlock does not
    cover that) and where only Landlock refused new entries (redteam).  The device nodes,
    /dev/shm and /dev/pts keep their own flags."""
    script = ("chmod 0777 /dev; mkdir /dev/corral-x; ln -s /x /dev/corral-y; "
              "echo ok > /dev/null && echo ok > /dev/shm/x && echo done")
    r = who.corral_json("--", "/bin/sh", "-c", script)
    assert r["exit_code"] == 0 and r["stdout"] == "done\n", r
    assert r["stderr"].count("Read-only file system") == 3, r["stderr"]
    # Negative control: the same attempt under bwrap's own /dev, as the same identity.
    ctl = who.run(raw_bwrap_argv(bwrap, [], ["/bin/sh", "-c", "chmod 0777 /dev && "
                                             "stat -c %a /dev"]))
    assert ctl.returncode == 0 and ctl.stdout == "777\n", ctl


def test_only_small_root_owned_world_readable_files_are_copied(tmp_path: Path) -> None:
    f = tmp_path / "conf"
    f.write_text("x\n")
    if os.geteuid() == 0:
        f.chmod(0o644)
        assert resolve._copyable(str(f)) == 0o444
        fd = fsops.open_host_file(str(f))
        os.close(fd)
    for mode in (0o640, 0o600):  # not world-readable: a copy could show more than a bind
        f.chmod(mode)
        assert resolve._copyable(str(f)) is None
    f.chmod(0o644)
    with open(f, "wb") as out:
        out.truncate(fsops.HOST_FILE_CAP + 1)
    assert resolve._copyable(str(f)) is None
    assert resolve._copyable(str(tmp_path)) is None  # a directory: bound
    f.chmod(0o600)  # and the launcher looks again, through the descriptor
    with pytest.raises(OSError) as e:
        fsops.open_host_file(str(f))
    assert e.value.errno == errno.EPERM
