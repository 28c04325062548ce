"""corral.gitredirect's check of loose objects, pure of any sandbox: the objects git
itself writes (SHA-1 and SHA-256) pass; one whose content is not its name, one that is a
link, one that does not inflate, and one not changed during the run are told apart."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest

from corral import fsops, gitredirect


def _repo(tmp_path: Path, fmt: str) -> tuple[Path, str]:
    repo = tmp_path / fmt
    subprocess.run(["git", "init", "-q", f"--object-format={fmt}", str(repo)], check=True)
    (repo / "f").write_bytes(b"ok\n" * 50_000)  # several parts of READ_CHUNK, inflated
    oid = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "f"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return repo, oid


def _found(repo: Path, changed: bool = True) -> list[str]:
    with fsops.Tree(str(repo)) as tree:
        return list(gitredirect._loose(tree, ".git", lambda st: changed and st is not None))


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_objects_git_writes_pass(tmp_path: Path, fmt: str) -> None:
    repo, _ = _repo(tmp_path, fmt)
    assert _found(repo) == []


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_an_object_that_is_not_its_name_is_found(tmp_path: Path, fmt: str) -> None:
    repo, oid = _repo(tmp_path, fmt)
    obj = repo / ".git" / "objects" / oid[:2] / oid[2:]
    rel = f".git/objects/{oid[:2]}/{oid[2:]}"
    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(b"blob 5\0EVIL\n"))
    assert _found(repo) == [rel]
    assert _found(repo, changed=False) == []  # the launch's own: left alone
    obj.write_bytes(b"not zlib at all")
    assert _found(repo) == [rel]
    good = zlib.compress(b"blob 150000\0" + b"ok\n" * 50_000)
    obj.write_bytes(good + b"trailing")  # git refuses garbage after the stream
    assert _found(repo) == [rel]
    obj.write_bytes(good)  # the true content again: nothing to say
    assert _found(repo) == []
    obj.unlink()
    os.symlink("/etc/hostname", obj)  # git follows it; corral does not
    assert _found(repo) == [rel]


def test_a_folder_or_store_made_a_link_is_taken_whole(tmp_path: Path) -> None:
    repo, oid = _repo(tmp_path, "sha1")
    objects = repo / ".git" / "objects"
    (objects / oid[:2]).rename(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", objects / oid[:2])
    assert _found(repo) == [f".git/objects/{oid[:2]}"]
    objects.rename(tmp_path / "store")
    os.symlink(tmp_path / "store", objects)
    assert _found(repo) == [".git/objects"]
    assert _found(repo, changed=False) == []
