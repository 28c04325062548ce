"""Copying a run's workspace out of its image (corral.export): real files, no sandbox."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tracemalloc
from pathlib import Path

import pytest

from corral import export as export_module
from corral.beneath import acting_as
from corral.export import export

MiB = 1 << 20
OWNER = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())


def _tree(src: Path) -> None:
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "data").write_bytes(b"x" * 10_000)
    os.link(src / "d" / "e" / "data", src / "d" / "again")
    with open(src / "sparse", "wb") as f:  # 64 MiB apparent, one block of data
        f.seek(64 * MiB)
        f.write(b"end")
    (src / "passwd").symlink_to("/etc/passwd")
    os.mkfifo(src / "fifo")
    (src / "setuid").write_text("#!/bin/sh\n")
    (src / "setuid").chmod(0o4755)


def _export(src: Path, dest: Path, max_bytes: int = 1 << 30) -> export_module.Exported:
    dest.mkdir()
    if os.geteuid() == 0:
        os.chown(dest, *OWNER)
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return export(fd, str(dest), OWNER, max_bytes)
    finally:
        os.close(fd)


def test_links_holes_and_special_files_survive_and_set_id_bits_do_not(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    _tree(src)
    done = _export(src, dest)
    assert done.complete and done.entries == 8, done
    assert os.stat(dest / "d" / "again").st_ino == os.stat(dest / "d" / "e" / "data").st_ino
    assert (dest / "sparse").stat().st_size == 64 * MiB + 3
    assert (dest / "sparse").stat().st_blocks * 512 < MiB  # the hole stays a hole
    assert os.readlink(dest / "passwd") == "/etc/passwd"  # the link itself, not its target
    assert stat.S_ISFIFO((dest / "fifo").lstat().st_mode)
    assert (dest / "setuid").stat().st_mode & 0o7777 == 0o755
    assert all(p.lstat().st_uid == OWNER[0] for p in dest.rglob("*"))
    # Control: an ordinary copy follows the link and writes the hole out in full.
    naive = tmp_path / "naive"
    shutil.copytree(src, naive, ignore=shutil.ignore_patterns("fifo"))
    assert (naive / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
    assert (naive / "sparse").stat().st_blocks * 512 >= 64 * MiB
    assert os.stat(naive / "d" / "again").st_ino != os.stat(naive / "d" / "e" / "data").st_ino


def test_an_export_past_its_bounds_stops_and_says_why(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _tree(src)
    assert not _export(src, tmp_path / "a", max_bytes=4096).complete  # more data than that
    monkeypatch.setattr(export_module, "MAX_ENTRIES", 3)
    cut = _export(src, tmp_path / "b")
    assert not cut.complete and "more than 3 entries" in cut.why
    monkeypatch.setattr(export_module, "MAX_ENTRIES", 100)
    monkeypatch.setattr(export_module, "MAX_DEPTH", 1)
    deep = _export(src, tmp_path / "c")
    assert not deep.complete and "deeper than 1" in deep.why


def _deep(top: Path, levels: int) -> int:
    """``levels`` directories of 250-character names below ``top``: a descriptor of the
    last (its path is longer than PATH_MAX past 16 levels)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        name = chr(97 + level % 26) * 250
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    return fd


def test_hard_links_anywhere_come_out_as_links(tmp_path: Path) -> None:
    """The old export linked each later name to a path of the first copy: past PATH_MAX
    (ENAMETOOLONG) or through a directory of mode 000 (EACCES for the owner), the whole
    export stopped incomplete, one hard link at the bottom of the tree sufficing."""
    src = tmp_path / "src"
    src.mkdir()
    deep = _deep(src, 20)
    try:
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=deep))
        os.link("f", "g", src_dir_fd=deep, dst_dir_fd=deep)
    finally:
        os.close(deep)
    (src / "locked").mkdir()
    (src / "locked" / "x").write_text("x")
    for i in range(3):
        os.link(src / "locked" / "x", src / f"y{i}")
    (src / "locked").chmod(0)  # its contents are copied first (names sort), then locked
    done = _export(src, tmp_path / "dest")
    assert done.complete, done
    dest = tmp_path / "dest"
    y0 = os.stat(dest / "y0")
    assert y0.st_nlink == 4 == os.stat(src / "y0").st_nlink  # no name more than the image's
    assert sorted(os.listdir(dest)) == ["aaaaaaaaaa" + "a" * 240, "locked", "y0", "y1", "y2"]
    # Control: a link made through the path of the first copy, as the old export did,
    # fails both ways.
    first = "/".join(chr(97 + level % 26) * 250 for level in range(20)) + "/f"
    with pytest.raises(OSError) as too_long:
        os.link(dest / first, dest / "z")
    assert too_long.value.errno == errno.ENAMETOOLONG
    (dest / "locked").chmod(0)
    if os.geteuid() == 0:
        with acting_as(OWNER), pytest.raises(PermissionError):
            os.link(dest / "locked" / "x", dest / "z")
    else:
        with pytest.raises(PermissionError):
            os.link(dest / "locked" / "x", dest / "z")
    (dest / "locked").chmod(0o700)
    (src / "locked").chmod(0o700)


def test_the_export_remembers_nothing_per_hard_link(tmp_path: Path) -> None:
    """The old export kept the path of every hard-linked file's first copy: about 4 KiB
    per file at the deepest path a link could go through, outside the run's limits (a
    red-team run of 40,000 such files grew the launcher by 115 MiB; 500,000 fit a 2 GiB
    image)."""
    src = tmp_path / "src"
    src.mkdir()
    deep = _deep(src, 15)
    count = 3000
    try:
        for i in range(count):
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=deep))
            os.link(f"f{i}", f"g{i}", src_dir_fd=deep, dst_dir_fd=deep)
    finally:
        os.close(deep)
    tracemalloc.start()
    try:
        done = _export(src, tmp_path / "dest")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert done.complete and done.entries == 15 + 2 * count, done
    assert peak < 2 * MiB, peak
    # Control: what the old export remembered for the same tree.
    prefix = "/".join(chr(97 + level % 26) * 250 for level in range(15))
    kept = {i: f"{prefix}/f{i}" for i in range(count)}
    assert sum(len(p) for p in kept.values()) > 10 * MiB
