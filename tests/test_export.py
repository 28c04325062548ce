"""Copying a run's workspace out of its image (corral.export): real files, no sandbox."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from corral import export as export_module
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
