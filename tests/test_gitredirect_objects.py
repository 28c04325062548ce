"""corral.gitredirect's check of loose objects, pure of any sandbox: the objects git
itself writes (SHA-1 and SHA-256) pass; one whose content is not its name, one that is a
link, one that does not inflate, and one not changed during the run are told apart."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import time
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


def _found(repo: Path, changed: bool = True, budget: gitredirect.Budget | None = None
           ) -> list[str]:
    with fsops.Tree(str(repo)) as tree:
        return list(gitredirect._loose(tree, ".git", lambda st: changed and st is not None,
                                       budget or gitredirect.Budget()))


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


def _packs(repo: Path, changed: bool = True, budget: gitredirect.Budget | None = None
           ) -> list[str]:
    with fsops.Tree(str(repo)) as tree:
        return [rel for rel, _ in gitredirect._packs(
            tree, ".git", lambda st: changed and st is not None,
            budget or gitredirect.Budget())]


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


# The host's git index-pack runs on what the agent wrote, outside the sandbox: a pack of
# a few KiB whose deltas each copy a 16 MiB base many times is an object of any size.
BASE = 0xFF0000  # the largest copy a delta's one-byte size field gives (0xFF << 16)


def _delta_bomb(objects: int, copies: int) -> bytes:
    """A valid pack: one blob of BASE zero bytes, then ``objects`` deltas against it, each
    ``copies`` copies of the whole base and a tail of its own (the objects differ)."""
    def header(kind: int, size: int) -> bytes:
        out = [(kind << 4) | (size & 15)]
        size >>= 4
        while size:
            out[-1] |= 0x80
            out.append(size & 0x7F)
            size >>= 7
        return bytes(out)

    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes(out + bytes([n]))

    def back(n: int) -> bytes:  # an OFS_DELTA's distance to its base
        out = [n & 0x7F]
        n >>= 7
        while n:
            n -= 1
            out.insert(0, 0x80 | (n & 0x7F))
            n >>= 7
        return bytes(out)

    body = bytearray(b"PACK" + struct.pack(">II", 2, 1 + objects))
    base_at = len(body)
    body += header(3, BASE) + zlib.compress(bytes(BASE), 9)
    for i in range(objects):
        tail = b"%d" % i
        delta = (varint(BASE) + varint(copies * BASE + len(tail))
                 + bytes([0x80 | 0x40, BASE >> 16]) * copies + bytes([len(tail)]) + tail)
        at = len(body)
        body += header(6, len(delta)) + back(at - base_at) + zlib.compress(delta, 9)
    return bytes(body + hashlib.sha1(body).digest())


def _plant(repo: Path, name: str, pack: bytes, idx: bytes) -> str:
    top = repo / ".git" / "objects" / "pack"
    top.mkdir(parents=True, exist_ok=True)
    (top / f"{name}.pack").write_bytes(pack)
    (top / f"{name}.idx").write_bytes(idx)
    return f".git/objects/pack/{name}.idx"


def test_index_pack_on_the_agents_pack_is_bounded_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, _ = _repo(tmp_path, "sha1")
    pack = _delta_bomb(1, 32)  # ~16 KiB: one object of 510 MiB
    assert len(pack) < 64 << 10
    (tmp_path / "bomb.pack").write_bytes(pack)
    # The control, unbounded: index-pack takes the object whole into memory, and the
    # index it writes is the truth about the pack.
    child = subprocess.Popen(["git", "index-pack", "--threads=1", "-o",
                              str(tmp_path / "bomb.idx"), str(tmp_path / "bomb.pack")],
                             stdout=subprocess.DEVNULL, cwd=tmp_path)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0
    assert usage.ru_maxrss > 400 << 10  # KiB: the 16 KiB pack held 510 MiB
    rel = _plant(repo, "pack-bomb", pack, (tmp_path / "bomb.idx").read_bytes())
    monkeypatch.setattr(gitredirect, "INDEX_PACK_BYTES", 256 << 20)
    assert _packs(repo) == [rel]  # bounded below what it needs: not vouched for, it goes
    monkeypatch.setattr(gitredirect, "INDEX_PACK_BYTES", 4 << 30)
    assert _packs(repo) == []  # the bound is what refused it: the index is true


def test_index_pack_time_is_one_budget_for_all_the_runs_packs(tmp_path: Path) -> None:
    repo, idx = _packed(tmp_path)
    honest = idx.name[:-4]
    for ext in (".idx", ".pack"):  # after the bomb in the order the audit takes them
        os.rename(idx.parent / f"{honest}{ext}", idx.parent / f"pack-z{ext}")
    assert _packs(repo, budget=gitredirect.Budget(600)) == []
    # 300 objects of 255 MiB each, ~50 KiB: minutes of hashing for index-pack unbounded;
    # its index is a well-formed one (another pack's) so that index-pack is asked.
    bomb = _plant(repo, "pack-bomb", _delta_bomb(300, 16),
                  (idx.parent / "pack-z.idx").read_bytes())
    budget = gitredirect.Budget(3)
    began = time.monotonic()
    found = _packs(repo, budget=budget)
    assert time.monotonic() - began < 90, "index-pack ran past the audit's budget"
    assert budget.left <= 0
    # The honest pack after it is not looked at once the budget is spent: it goes too.
    assert found == [bomb, ".git/objects/pack/pack-z.idx"]
    for ext in (".idx", ".pack"):
        (idx.parent / f"pack-bomb{ext}").unlink()
    assert _packs(repo, budget=gitredirect.Budget(600)) == []  # control: it passes
    assert _packs(repo, budget=gitredirect.Budget(0)) == [".git/objects/pack/pack-z.idx"]


def test_hashing_loose_objects_shares_the_audits_budget(tmp_path: Path) -> None:
    """A loose object is hashed by the audit itself: 1 MiB deflated is 1 GiB to inflate
    and hash (seconds of the host's CPU each), so the objects share the packs' budget; one
    not finished within it goes, and once it is spent nothing more is vouched for."""
    repo, small = _repo(tmp_path, "sha1")
    size = 1 << 30
    head, zeros = b"blob %d\0" % size, bytes(1 << 24)
    deflate, digest = zlib.compressobj(9), hashlib.sha1(head)
    parts = [deflate.compress(head)]
    for _ in range(size >> 24):
        parts.append(deflate.compress(zeros))
        digest.update(zeros)
    data = b"".join([*parts, deflate.flush()])
    assert len(data) < 2 << 20
    big = digest.hexdigest()  # an honest object: its content is its name
    (repo / ".git" / "objects" / big[:2]).mkdir(exist_ok=True)
    (repo / ".git" / "objects" / big[:2] / big[2:]).write_bytes(data)
    assert _found(repo, budget=gitredirect.Budget(600)) == []  # control: it is checked
    budget = gitredirect.Budget(0.2)
    began = time.monotonic()
    assert f".git/objects/{big[:2]}/{big[2:]}" in _found(repo, budget=budget)
    assert time.monotonic() - began < 60 and budget.left <= 0
    assert sorted(_found(repo, budget=budget)) == sorted(
        f".git/objects/{o[:2]}/{o[2:]}" for o in (big, small))  # spent: none vouched for
