"""Collecting untrusted results and staging inputs: no symlink followed, no FIFO blocks."""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

import pytest

from corral import fsops, workspace
from corral.errors import UsageError


def _collect_in_thread(root: Path) -> tuple[list[workspace.Change], bool]:
    out: list[tuple[list[workspace.Change], bool]] = []
    t = threading.Thread(target=lambda: out.append(workspace.collect(str(root), {})), daemon=True)
    t.start()
    t.join(60)
    assert out, "collect blocked"
    return out[0]


def test_collect_lists_files_with_size_and_hash(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0" * 10)
    changes, cut = workspace.collect(str(tmp_path), {})
    by_path = {c.path: c for c in changes}
    assert not cut
    assert by_path["a.txt"].size == 6
    assert by_path["a.txt"].sha256 == \
        "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert by_path["sub"].type == "dir" and by_path["sub/b.bin"].size == 10


def test_collect_never_follows_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "link").symlink_to(outside / "secret")
    (ws / "dirlink").symlink_to(outside)
    changes, _ = workspace.collect(str(ws), {})
    by_path = {c.path: c for c in changes}
    assert by_path["link"].type == "symlink" and by_path["link"].sha256 is None
    assert by_path["link"].target == str(outside / "secret")
    assert "dirlink/secret" not in by_path
    # Negative control: the same tree walked with symlinks followed does reach the secret.
    assert any("secret" in files for _, _, files in os.walk(ws, followlinks=True))


def test_collect_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    changes, _ = _collect_in_thread(tmp_path)
    assert [(c.path, c.type, c.sha256) for c in changes] == [("pipe", "fifo", None)]


def test_collect_caps_the_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_LISTED", 5)
    for i in range(20):
        (tmp_path / f"f{i}").write_text("x")
    changes, cut = workspace.collect(str(tmp_path), {})
    assert len(changes) == 5 and cut


def test_collect_caps_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_HASHED", 100)
    (tmp_path / "big").write_bytes(b"x" * 1000)
    (tmp_path / "small").write_bytes(b"x" * 10)
    by_path = {c.path: c for c in workspace.collect(str(tmp_path), {})[0]}
    assert by_path["big"].sha256 is None and by_path["big"].size == 1000
    assert by_path["small"].sha256 is not None


def test_collect_tells_created_modified_deleted(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("same")
    (tmp_path / "edit").write_text("old")
    (tmp_path / "gone").write_text("bye")
    before = workspace.snapshot(str(tmp_path))
    (tmp_path / "edit").write_text("new!")
    (tmp_path / "gone").unlink()
    (tmp_path / "new").write_text("hi")
    changes = {c.path: c.change for c in workspace.collect(str(tmp_path), before)[0]}
    assert changes == {"edit": "modified", "gone": "deleted", "new": "created"}


def test_copy_in_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("host file")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.txt").symlink_to(victim)
    src = tmp_path / "data.txt"
    src.write_text("input")
    with fsops.Tree(str(ws)) as tree:
        workspace.copy_in(tree, str(src))
    assert victim.read_text() == "host file"
    assert not (ws / "data.txt").is_symlink() and (ws / "data.txt").read_text() == "input"
    # Negative control: a plain open() of the destination writes through the link.
    (ws / "again").symlink_to(victim)
    (ws / "again").write_text("overwritten")
    assert victim.read_text() == "overwritten"


def test_copy_in_copies_directories_without_dereferencing(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("x = 1\n")
    (src / "link").symlink_to("/etc/passwd")
    ws = tmp_path / "ws"
    ws.mkdir()
    with fsops.Tree(str(ws)) as tree:
        workspace.copy_in(tree, str(src))
    assert (ws / "proj" / "pkg" / "m.py").read_text() == "x = 1\n"
    assert os.readlink(ws / "proj" / "link") == "/etc/passwd"


def test_missing_inputs_are_refused_before_anything_exists(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        workspace.check_inputs([str(tmp_path / "nope")])
    with pytest.raises(UsageError, match="not a usable path"):
        workspace.check_inputs([str(tmp_path / "a\nb")])


def test_collect_reports_a_walk_cut_short(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_DEPTH", 8)
    deep = tmp_path
    for _ in range(12):
        deep = deep / "d"
    deep.mkdir(parents=True)
    _, cut = workspace.collect(str(tmp_path), {})
    assert cut, "a walk stopped by its depth bound must say the list is incomplete"
    # Control: with room for the whole tree the same walk is complete.
    monkeypatch.setattr(workspace, "MAX_DEPTH", 64)
    assert not workspace.collect(str(tmp_path), {})[1]


def test_collect_caps_the_bytes_of_listed_paths(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_LISTED_BYTES", 100)
    for i in range(10):
        (tmp_path / (f"{i}" + "n" * 40)).write_text("x")
    changes, cut = workspace.collect(str(tmp_path), {})
    assert cut and sum(len(c.path) for c in changes) <= 100


def test_collect_reads_a_huge_directory_a_chunk_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk read each directory whole (and sorted it) before its entry bound applied:
    a red-team workspace of 300,000 names of 250 bytes grew the launcher by 100 MiB after
    the run, outside its limits.  Scaled down: 40,000 names, a walk bounded at 1,000."""
    one = tmp_path / "one"
    one.write_text("x")
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(40_000):  # links: one inode, 40,000 names
        os.link(one, wide / f"{i:0250d}")
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 1000)
    tracemalloc.start()
    try:
        changes, cut = workspace.collect(str(tmp_path), {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cut and len(changes) <= 1000
    assert peak < 2 << 20, peak
    # Control: the whole directory at once, as the walk used to read it.
    tracemalloc.start()
    try:
        names = sorted(os.listdir(wide))
        _, whole = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(names) == 40_000 and whole > 10 << 20, whole
