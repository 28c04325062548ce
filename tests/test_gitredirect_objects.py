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


def _packed(tmp_path: Path, fmt: str = "sha1", version: int = 2) -> tuple[Path, Path]:
    repo, _ = _repo(tmp_path, fmt)
    for text in (b"a\n", b"b\n" * 1000):
        subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=text,
                       check=True, capture_output=True)
    subprocess.run(["git", "-C", str(repo), "-c", f"pack.indexVersion={version}",
                    "repack", "-qad"], check=True)  # nothing reachable: packs all loose ones?
    packs = sorted((repo / ".git" / "objects" / "pack").glob("pack-*.idx"))
    if not packs:  # repack -a packs only reachable objects: pack the loose ones by name
        names = subprocess.run(
            ["sh", "-c", "cd .git/objects && ls -d ??/* | tr -d /"], cwd=repo, check=True,
            capture_output=True, text=True).stdout
        subprocess.run(["git", "-C", str(repo), "-c", f"pack.indexVersion={version}",
                        "pack-objects", ".git/objects/pack/pack"], input=names, text=True,
                       check=True, capture_output=True)
        packs = sorted((repo / ".git" / "objects" / "pack").glob("pack-*.idx"))
    return repo, packs[0]


@pytest.mark.parametrize(("fmt", "version"), [("sha1", 2), ("sha1", 1), ("sha256", 2)])
def test_a_pack_git_wrote_passes_and_its_index_is_read(tmp_path: Path, fmt: str, version: int
                                                       ) -> None:
    repo, idx = _packed(tmp_path, fmt, version)
    said = gitredirect._pack_index(idx.read_bytes())
    assert said is not None and len(said) == 3, said
    assert all(len(name) == (20 if fmt == "sha1" else 32) for name in said)
    assert _packs(repo) == []


def _packs(repo: Path, changed: bool = True) -> list[str]:
    with fsops.Tree(str(repo)) as tree:
        return [rel for rel, _ in gitredirect._packs(
            tree, ".git", lambda st: changed and st is not None)]


def test_an_index_that_lies_or_lists_a_name_twice_is_found(tmp_path: Path) -> None:
    repo, idx = _packed(tmp_path)
    rel = f".git/objects/pack/{idx.name}"
    data = bytearray(idx.read_bytes())
    idx.chmod(0o644)
    names = 1032
    first, second = bytes(data[names:names + 20]), bytes(data[names + 20:names + 40])
    swapped = bytearray(data)  # two names trade offsets: each is found at the other's
    swapped[names:names + 20], swapped[names + 20:names + 40] = second, first
    idx.write_bytes(bytes(swapped))
    assert gitredirect._pack_index(bytes(swapped)) is None  # no longer ascending
    assert _packs(repo) == [rel]
    offsets = 1032 + 3 * 24
    moved = bytearray(data)  # sorted still, but the first object's offset is the second's
    moved[offsets:offsets + 4] = data[offsets + 4:offsets + 8]
    idx.write_bytes(bytes(moved))
    assert gitredirect._pack_index(bytes(moved)) is not None
    assert _packs(repo) == [rel]
    assert _packs(repo, changed=False) == []  # the launch's own: left alone
    twice = bytearray(data)
    twice[names + 20:names + 40] = first
    assert gitredirect._pack_index(bytes(twice)) is None
    assert gitredirect._pack_index(b"\377tOc" + bytes(2000)) is None
    idx.write_bytes(bytes(data))
    assert _packs(repo) == []


def test_unchecked_pack_caches_made_during_the_run_go(tmp_path: Path) -> None:
    repo, idx = _packed(tmp_path)
    pack_dir = idx.parent
    for name in ("multi-pack-index", idx.name[:-4] + ".bitmap", idx.name[:-4] + ".rev"):
        (pack_dir / name).write_bytes(b"x")
    assert sorted(_packs(repo)) == sorted(
        f".git/objects/pack/{n}" for n in ("multi-pack-index", idx.name[:-4] + ".bitmap",
                                           idx.name[:-4] + ".rev"))
    assert _packs(repo, changed=False) == []
