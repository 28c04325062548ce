"""fsops: host-side operations beneath payload-writable trees never follow a link out,
never block, and, started by root, act as the tree's owner.

Each test runs as root and as the unprivileged test user (a small script run as that
identity), and each refusal has its control: the same operation done by path, as the
launcher did it before, lands outside the tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import Identity
from corral import fsops

# Run as the identity under test: prints one JSON line.
PRELUDE = """
import errno, json, os, sys
from corral import fsops
def attempt(fn):
    try:
        return ["ok", fn()]
    except OSError as e:
        return [errno.errorcode.get(e.errno, str(e.errno)), None]
"""


def as_identity(who: Identity, body: str, *, fallback: bool = False) -> dict[str, object]:
    code = PRELUDE
    if fallback:  # the component walk that kernels without openat2 get
        code += "from corral import beneath; beneath._kernel().openat2 = False\n"
    code += textwrap.dedent(body)
    proc = subprocess.run([*who.prefix(), "-c", code], env=who.environ(), cwd=who.tmp,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def tree_with_escape(who: Identity) -> tuple[Path, Path]:
    """A tree whose ``link`` points outside it, at ``outside`` (owned by who, empty)."""
    tree, outside = who.tmp / "tree", who.tmp / "outside"
    for d in (tree, outside, tree / "real"):
        d.mkdir()
    (tree / "link").symlink_to(outside)
    (outside / "secret").write_text("SECRET")
    (tree / "real" / "f").write_text("inside")
    if who.is_root:
        return tree, outside
    for p in (tree, outside, tree / "real", tree / "real" / "f", outside / "secret"):
        os.chown(p, who.uid, who.gid)
    os.lchown(tree / "link", who.uid, who.gid)
    return tree, outside


@pytest.mark.parametrize("fallback", [False, True], ids=["openat2", "component-walk"])
def test_no_operation_follows_a_link_out_of_its_tree(who: Identity, fallback: bool) -> None:
    tree, outside = tree_with_escape(who)
    r = as_identity(who, f"""
        t = fsops.Tree({str(tree)!r})
        print(json.dumps({{
            "read_inside": attempt(lambda: t.read("real/f", 100).decode()),
            "read_through_link": attempt(lambda: t.read("link/secret", 100)),
            "read_the_link": attempt(lambda: t.read("link", 100)),
            "dotdot": attempt(lambda: t.read("real/../../outside/secret", 100)),
            "absolute": attempt(lambda: t.read({str(outside / "secret")!r}, 100)),
            "mkdir_through_link": attempt(lambda: t.mkdir("link/planted") and None),
            "lstat_through_link": attempt(lambda: t.lstat("link/secret") and None),
            "unlink_through_link": attempt(lambda: t.unlink("link/secret")),
            "chmod_through_link": attempt(lambda: t.chmod("link/secret", 0o777) and None),
        }}))
    """, fallback=fallback)
    assert r["read_inside"] == ["ok", "inside"]
    for key in ("read_through_link", "mkdir_through_link", "lstat_through_link",
                "unlink_through_link", "chmod_through_link"):
        assert r[key][0] in ("ELOOP", "ENOTDIR"), (key, r)  # type: ignore[index]
    assert r["read_the_link"] == ["ok", None]  # the link itself: not a regular file
    assert r["dotdot"][0] == "EXDEV" and r["absolute"][0] == "EXDEV"  # type: ignore[index]
    assert (outside / "secret").read_text() == "SECRET"
    assert not (outside / "planted").exists()
    assert (outside / "secret").stat().st_mode & 0o777 != 0o777
    # Control: the same operations by path go straight through the link.
    (tree / "link" / "planted").mkdir()
    assert (outside / "planted").is_dir()


def test_reads_never_block_and_are_capped(who: Identity) -> None:
    tree = who.tmp / "tree"
    tree.mkdir()
    os.mkfifo(tree / "fifo")
    (tree / "big").write_bytes(b"x" * 5000)
    (tree / "dir").mkdir()
    if not who.is_root:
        for p in tree.iterdir():
            os.chown(p, who.uid, who.gid)
        os.chown(tree, who.uid, who.gid)
    r = as_identity(who, f"""
        t = fsops.Tree({str(tree)!r})
        print(json.dumps({{
            "fifo": attempt(lambda: t.read("fifo", 100)),
            "dir": attempt(lambda: t.read("dir", 100)),
            "missing": attempt(lambda: t.read("missing", 100)),
            "big": attempt(lambda: t.read("big", 4096)),
            "fits": attempt(lambda: len(t.read("big", 5000))),
        }}))
    """)
    assert r == {"fifo": ["ok", None], "dir": ["ok", None], "missing": ["ok", None],
                 "big": ["EFBIG", None], "fits": ["ok", 5000]}
    # Control: opening the FIFO by path, as a plain open() does, blocks (here: would block).
    with pytest.raises(OSError):
        os.open(tree / "fifo", os.O_WRONLY | os.O_NONBLOCK)  # no reader: ENXIO, i.e. it waits


def test_root_acts_as_the_owner(root: Identity) -> None:
    """Started by root, what is made in a user's tree is the user's, with the user's rights."""
    from conftest import _ensure_user

    user = _ensure_user()
    groups_before = os.getgroups()
    owner = (user.pw_uid, user.pw_gid)
    tree = root.tmp / "tree"
    tree.mkdir()
    os.chown(tree, *owner)
    (tree / "roots").mkdir(mode=0o755)  # root's own folder inside: the user may not write it
    with fsops.Tree(str(tree), owner) as t:
        made = t.makedirs("a/b")
        assert (made.st_uid, made.st_gid) == owner
        assert all((tree / p).stat().st_uid == user.pw_uid for p in ("a", "a/b"))
        with pytest.raises(PermissionError):
            t.mkdir("roots/planted")
        fd = t.open("a/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        assert (tree / "a" / "new").stat().st_uid == user.pw_uid
    # This thread is root again (real, effective, saved and filesystem ids), with root's
    # groups; control: acting as itself, root may write the folder the user could not.
    status = Path("/proc/thread-self/status").read_text()
    assert "\nUid:\t0\t0\t0\t0\n" in status and "\nGid:\t0\t0\t0\t0\n" in status
    assert os.getgroups() == groups_before
    with fsops.Tree(str(tree)) as t:
        assert t.mkdir("roots/planted").st_uid == 0


def test_a_swapped_component_never_turns_creation_outside(who: Identity) -> None:
    """The race of issue 16: a directory swapped for a link with RENAME_EXCHANGE while the
    launcher makes ``hooks`` in it.  By descriptor, nothing ever lands outside; the control
    (mkdir, then chown, by path) lands outside within a few hundred tries."""
    tree, outside = tree_with_escape(who)
    r = as_identity(who, f"""
        import ctypes, threading
        libc = ctypes.CDLL(None, use_errno=True)
        tree, outside = {str(tree)!r}, {str(outside)!r}
        stop = False
        def swap():
            while not stop:  # renameat2(AT_FDCWD, real, AT_FDCWD, link, RENAME_EXCHANGE)
                libc.syscall(316, -100, (tree + "/real").encode(), -100,
                             (tree + "/link").encode(), 2)
        t = threading.Thread(target=swap)
        t.start()
        tries = {{"fsops": 0, "by_path": 0}}
        landed = {{"fsops": False, "by_path": False}}
        try:
            with fsops.Tree(tree) as tr:
                for i in range(3000):
                    tries["fsops"] += 1
                    try:
                        tr.mkdir(f"real/h{{i}}")
                    except OSError:
                        pass
                    if any(n.startswith("h") for n in os.listdir(outside)):
                        landed["fsops"] = True
                        break
            for i in range(3000):
                tries["by_path"] += 1
                try:
                    os.mkdir(f"{{tree}}/real/p{{i}}")
                except OSError:
                    pass
                if any(n.startswith("p") for n in os.listdir(outside)):
                    landed["by_path"] = True
                    break
        finally:
            stop = True
            t.join()
        print(json.dumps({{"landed": landed, "tries": tries}}))
    """)
    assert r["landed"] == {"fsops": False, "by_path": True}, r


def _deep(top: Path, depth: int) -> Path:
    """A chain of ``depth`` one-letter folders beneath ``top``, a file at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):  # by descriptor: the path soon outgrows what one call takes
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.close(fd)
    return top / "d"


def _recursive_count(fd: int) -> int:  # the old removal's shape, for the control
    total = 0
    for name in os.listdir(fd):
        if name == "d":
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            try:
                total += 1 + _recursive_count(sub)
            finally:
                os.close(sub)
    return total


def test_a_tree_as_deep_as_the_payload_likes_is_removed_and_moved(tmp_path: Path) -> None:
    """A folder 1,200 levels deep made the recursive removal (and the copy of a move
    across file systems) raise RecursionError: the live watch's thread died and the audit
    crashed (found by review).  Both are iterative now.  Control: a recursive walk of the
    same tree fails so."""
    from corral import fswalk

    deep = _deep(tmp_path, 1200)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(RecursionError):
            _recursive_count(fd)
    finally:
        os.close(fd)
    other = Path("/dev/shm") / f"corral-deep-{os.getpid()}"  # another file system: a copy
    other.mkdir()
    try:
        with fsops.Tree(str(tmp_path)) as tree, fsops.Tree(str(other)) as dest:
            fswalk.move(tree, "d", dest, "moved")
            assert not deep.exists() and (other / "moved").is_dir()
            fswalk.remove(dest, "moved")
            assert not (other / "moved").exists()
    finally:
        subprocess.run(["rm", "-rf", str(other)], check=True)
