"""corral.gitindex against indexes host git 2.39 writes (formats 2, 3, 4; SHA-1, SHA-256)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.gitindex import unhide


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "safe.directory=*", "-c", "user.name=u", "-c",
                           "user.email=u@example.invalid", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.parametrize("version", ["2", "3", "4"])
@pytest.mark.parametrize("hash_", ["sha1", "sha256"])
def test_marks_are_found_and_cleared_as_git_reads_them(tmp_path: Path, version: str,
                                                       hash_: str) -> None:
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", f"--object-format={hash_}", str(repo)], check=True)
    names = ["f", "a/x", "a/b/long-name-y", "a/b/z"]  # shared prefixes: format 4 strips them
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "update-index", "--index-version", version)
    index = repo / ".git" / "index"
    assert unhide(index.read_bytes()) is None  # control: nothing marked, nothing found
    _git(repo, "update-index", "--assume-unchanged", "a/b/long-name-y")
    if version != "2":  # skip-worktree needs format 3 (git raises a 2 to it)
        _git(repo, "update-index", "--skip-worktree", "a/x")
    (repo / "a/b/long-name-y").write_text("EVIL\n")
    assert _git(repo, "status", "--porcelain") == ""  # the marks hide the change
    found = unhide(index.read_bytes())
    assert found is not None
    assert sorted(found[1]) == sorted([b"a/b/long-name-y", *([b"a/x"] if version != "2"
                                                                 else [])])
    index.write_bytes(found[0])
    assert _git(repo, "ls-files", "-v").split() == ["H", "a/b/long-name-y", "H", "a/b/z",
                                                    "H", "a/x", "H", "f"]
    assert _git(repo, "status", "--porcelain") == " M a/b/long-name-y\n"
    # A sparse checkout's own skip-worktree marks stay when asked.
    _git(repo, "update-index", "--skip-worktree", "a/x")
    kept = unhide(index.read_bytes(), skip_worktree=False)
    assert kept is None


def test_what_is_no_index_is_left_alone() -> None:
    assert unhide(b"") is None and unhide(b"DIRC" + b"\0" * 40) is None
