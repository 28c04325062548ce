"""A fresh workspace's image is formatted by copying a template, made once by corral.

Started by root, a run with a disk limit gets an ext4 image of its own (corral.diskimage).
mke2fs took ~4 ms of every run; the image is now a copy of the few blocks of a template
that corral formatted once in its cache (/var/cache/corral/images).  What a template holds
is what every run's workspace starts with, so only one corral made itself is used.  Root
only: a plain user's workspace has no image (it is measured, tests/test_disk.py).  Each
test has a cache of its own (CORRAL_CACHE_DIR): a planted template reaches no other test.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import Identity

pytestmark = pytest.mark.sandbox

PLANT = "test -e /work/POISON && echo planted || echo clean"


def _run(root: Identity, runs: Path, script: str = PLANT) -> dict[str, object]:
    r = root.corral_json("--runs-dir", str(runs), "--disk", "64M", "--", "/bin/sh", "-c",
                         script, env={"CORRAL_CACHE_DIR": str(root.tmp / "cache")})
    assert r["status"] == "exited", r
    return r


def _templates(runs: Path) -> list[Path]:
    return sorted((runs.parent / "cache" / "images").iterdir())


def test_fresh_workspaces_are_copies_of_one_template(root: Identity) -> None:
    runs = root.tmp / "runs"
    for _ in range(3):
        r = _run(root, runs, "df -k /work | tail -1; : > /work/made; ls -ln /work")
        out = str(r["stdout"])
        assert "/dev/loop" in out and " 65534 65534 " in out, out  # its own fs, nobody's
    [template] = _templates(runs)  # made once, used by all three
    st = template.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_blocks * 512 < 4 << 20 < st.st_size  # sparse: a few blocks of metadata
    assert stat.S_IMODE(template.parent.lstat().st_mode) == 0o700
    assert not list(runs.glob("*/work.img"))  # each run's copy let go after the run
    assert not list(runs.glob(".*"))  # the runs directory holds runs alone


def _poison(template: Path) -> None:
    """A template of the same name and size, formatted here, with /POISON in it."""
    poison = template.with_name("poison")
    with open(poison, "wb") as f:
        f.truncate(template.stat().st_size)
    subprocess.run(["/usr/sbin/mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal",
                    "-E", "root_owner=65534:65534", str(poison)], check=True)
    subprocess.run(["/usr/sbin/debugfs", "-w", "-R", "write /etc/hostname POISON",
                    str(poison)], check=True, capture_output=True)
    poison.chmod(0o600)
    poison.replace(template)


@pytest.mark.parametrize("how", ["trusted", "group-readable", "folder of another user",
                                 "folder a symlink"])
def test_only_a_template_corral_made_is_used(root: Identity, how: str) -> None:
    """Control ("trusted"): a planted template in corral's own private folder is what the
    run's workspace holds, so a template is worth guarding.  One whose file or folder is not
    private to root, or reached through a symlink, is ignored: the run formats its own."""
    runs = root.tmp / "runs"
    _run(root, runs)
    [template] = _templates(runs)
    _poison(template)
    folder = template.parent
    if how == "group-readable":
        template.chmod(0o640)
    elif how == "folder of another user":
        os.chown(folder, 65534, 65534)
    elif how == "folder a symlink":
        elsewhere = root.tmp / "elsewhere"
        folder.rename(elsewhere)
        folder.symlink_to(elsewhere)
    out = str(_run(root, runs)["stdout"]).strip()
    assert out == ("planted" if how == "trusted" else "clean"), how
    if how == "folder a symlink":
        folder.unlink()
        shutil.rmtree(root.tmp / "elsewhere")


def test_templates_of_many_sizes_do_not_pile_up(root: Identity) -> None:
    """One template per size (the disk limit plus the inputs): a stream of runs of other
    sizes (corral serve's requests) left one each, without bound (found by review).  The
    cache keeps eight, the oldest going first."""
    runs = root.tmp / "runs"
    for mib in range(20, 31):  # eleven sizes
        r = root.corral_json("--runs-dir", str(runs), "--disk", f"{mib}M", "--", "/bin/true",
                             env={"CORRAL_CACHE_DIR": str(root.tmp / "cache")})
        assert r["status"] == "exited", r
    assert len(_templates(runs)) == 8
