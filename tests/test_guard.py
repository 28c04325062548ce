"""Launch-directory rules and discovery inside writable trees (no sandbox needed)."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from corral import discover, fsops, guard, repos
from corral.agent import Entry, Layout, agent_mounts, agent_seal
from corral.bwrap import render
from corral.errors import UsageError
from corral.guard import Finding
from corral.launch import Numbering
from corral.locate import Roots


def scan(path: Path, allowed: tuple[str, ...] = ()) -> list[Finding]:
    """discover.scan of one writable tree, as resolve_agent makes it."""
    roots = Roots([fsops.Tree(str(path))])
    try:
        return discover.scan(roots.trees[0], repos.Scope(roots, "/nonexistent", True), allowed)
    finally:
        roots.close()


def verify(path: Path, findings: list[Finding]) -> list[list[object]]:
    with fsops.Tree(str(path)) as tree:
        return discover.verify_unchanged(tree, findings)


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "dev" / "demo").mkdir(parents=True)
    return home


@pytest.mark.parametrize("path", ["/", "/usr", "/usr/local/src", "/etc", "/tmp", "/var",
                                  "/proc/self", "/home"])
def test_system_directories_are_refused(path: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="refusing"):
        guard.check_writable_root(path, "project", home=str(_home(tmp_path)))


def test_home_its_ancestors_and_credential_holders_are_refused(tmp_path: Path) -> None:
    home = _home(tmp_path)
    for path in (home, home.parent, tmp_path):
        with pytest.raises(UsageError, match="home directory"):
            guard.check_writable_root(str(path), "project", home=str(home))
    holder = home / "dev" / "copy-of-home"
    (holder / ".aws").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"holds credentials \(.aws\)"):
        guard.check_writable_root(str(holder), "project", home=str(home))
    assert guard.check_writable_root(str(home / "dev" / "demo"), "project",
                                     home=str(home)) == str(home / "dev" / "demo")


def test_symlinks_are_resolved_before_the_rules(tmp_path: Path) -> None:
    home = _home(tmp_path)
    link = home / "dev" / "innocent"
    link.symlink_to(home)
    with pytest.raises(UsageError, match="really"):
        guard.check_writable_root(str(link), "project", home=str(home))


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_scan_finds_what_must_be_protected_or_hidden(tmp_path: Path) -> None:
    _tree(tmp_path, {".git/HEAD": "", ".git/config": "", "a/b/.git/config": "",
                     "a/b/.git/HEAD": "", ".env": "", ".env.example": "", "k/server.pem": "",
                     "k/id_ed25519": "", "k/id_ed25519.pub": "", ".vscode/tasks.json": "",
                     "deep/er/.bashrc": "", "src/main.py": "", "nested/.ssh/x": "",
                     "id_utils.py": ""})
    found = {(os.path.relpath(f.path, tmp_path), f.action) for f in scan(tmp_path)}
    assert {(".git", "pin"), (".git/hooks", "protect"), (".git/config", "protect"),
            ("a/b/.git", "pin"), ("a/b/.git/hooks", "protect"), (".env", "hide"),
            ("k/server.pem", "hide"), ("k/id_ed25519", "hide"), (".vscode", "protect"),
            ("deep/er/.bashrc", "protect"), ("nested/.ssh", "hide")} <= found
    paths = {p for p, _ in found}
    assert not paths & {".env.example", "k/id_ed25519.pub", "src/main.py", "id_utils.py"}
    assert (tmp_path / ".git" / "hooks").is_dir()  # created so that it can be protected


def test_allowed_secrets_stay_visible(tmp_path: Path) -> None:
    _tree(tmp_path, {".env": "", "cert.pem": ""})
    found = {os.path.basename(f.path) for f in scan(tmp_path, ("*.pem",))}
    assert found == {".env"}


def test_scan_refuses_symlinked_protected_paths(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".vscode").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="symbolic link"):
        scan(tmp_path)


def test_scan_fails_closed_past_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr(discover, "MAX_SCANNED", 50)
    for i in range(60):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(UsageError, match="more than 50 entries"):
        scan(tmp_path)


def test_verify_unchanged_catches_a_swapped_component(tmp_path: Path) -> None:
    _tree(tmp_path, {".git/config": "", ".git/HEAD": ""})
    findings = scan(tmp_path)
    verify(tmp_path, findings)
    os.rename(tmp_path / ".git", tmp_path / "real-git")
    (tmp_path / ".git").symlink_to(tmp_path / "real-git")
    with pytest.raises(UsageError, match="changed while corral was starting"):
        verify(tmp_path, findings)


def test_scan_finds_one_secret_in_a_large_tree(tmp_path: Path) -> None:
    for d in range(100):
        sub = tmp_path / f"pkg{d}"
        sub.mkdir()
        for f in range(100):
            (sub / f"m{f}.py").write_text("")
    (tmp_path / "pkg57" / ".env.local").write_text("")
    assert [os.path.relpath(f.path, tmp_path) for f in scan(tmp_path)] == [
        "pkg57/.env.local"]


def test_agent_mounts_order() -> None:
    layout = Layout(
        project="/home/u/dev/p", home="/home/u", hidden_trees=("/home", "/tmp"),
        hidden_files=("/etc/shadow",),
        read_only=(Entry("/home/u/.gitconfig", "ro", "file", "x"),),
        writable=(Entry("/home/u/dev/p", "rw", "dir", "project"),
                  Entry("/home/u/.claude", "rw", "dir", "state")),
        findings=(Finding("/home/u/dev/p/.env", "hide", "file", "s"),
                  Finding("/home/u/dev/p/.git/hooks", "protect", "dir", "h"),
                  Finding("/home/u/dev/p/.git", "pin", "dir", "g")),
        tmp_bytes=100, shm_bytes=50, ptys=64)
    words = render([*agent_mounts(layout), *agent_seal(layout)], Numbering(first=3))
    assert words == [
        "--ro-bind", "/", "/",
        "--perms", "0755", "--tmpfs", "/home",
        "--size", "100", "--perms", "1777", "--tmpfs", "/tmp",
        "--perms", "0444", "--ro-bind-data", "3", "/etc/shadow",
        "--proc", "/proc",
        "--perms", "0444", "--ro-bind-data", "4", "/proc/keys",
        "--perms", "0444", "--ro-bind-data", "5", "/proc/key-users",
        "--dev", "/dev",
        "--size", "50", "--perms", "1777", "--tmpfs", "/dev/shm",
        "--dev-bind", "/dev/pts", "/dev/pts",  # the devpts with max=64 bwrap's child mounted
        "--perms", "0755", "--dir", "/home/u",
        "--ro-bind-fd", "6", "/home/u/.gitconfig",  # by descriptor: no link followed
        "--bind-fd", "7", "/home/u/.claude",
        "--perms", "0755", "--dir", "/home/u/dev",
        "--bind-fd", "8", "/home/u/dev/p",
        "--bind-fd", "9", "/home/u/dev/p/.git",
        "--perms", "0444", "--ro-bind-data", "10", "/home/u/dev/p/.env",
        "--ro-bind-fd", "11", "/home/u/dev/p/.git/hooks",
        "--remount-ro", "/home",
        "--remount-ro", "/dev",  # bwrap's /dev tmpfs, the payload's own for a plain user
    ]


def test_the_launch_scan_reads_a_huge_directory_in_parts(tmp_path: Path) -> None:
    """A previous session can leave a folder of a million names in the project: the scan
    held each directory's whole listing (about 400 MiB of launcher at 500,000 names).  It
    reads SCAN_CHUNK entries at a time now; control: one whole listing of the same folder
    takes more than four times the scan's peak."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "f").touch()
    for i in range(60_000):
        os.link(big / "f", big / f"a-file-with-a-longish-name-{i}")
    (big / ".env").touch()
    tracemalloc.start()
    try:
        found = scan(tmp_path)
        scanned = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        with fsops.Tree(str(tmp_path)) as tree:
            tree.scandir("big")  # what the scan did before: the directory's whole listing
        listed = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [os.path.relpath(f.path, tmp_path) for f in found] == ["big/.env"]
    assert scanned * 4 < listed, (scanned, listed)


def test_a_repository_split_across_parts_is_still_one(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare repository whose directory comes in several parts is still recognised (by
    its marker names), and so is its hooks folder's protection; control: no single part
    of two entries holds the markers a listing check needs."""
    _tree(tmp_path, {"backup/HEAD": "ref: refs/heads/main\n", "backup/config": "",
                     "backup/objects/x": "", "backup/refs/heads/x": "", "backup/a": "",
                     "backup/b": "", "backup/c": ""})
    with fsops.Tree(str(tmp_path)) as tree:  # (before the scan makes its placeholders)
        parts = [{e.name for e in part} for part in tree.scandir_chunks("backup", size=2)]
    assert len(parts) > 2 and not any(repos.is_git_dir(p) for p in parts)
    monkeypatch.setattr(discover, "SCAN_CHUNK", 2)
    found = {(os.path.relpath(f.path, tmp_path), f.action) for f in scan(tmp_path)}
    assert ("backup/config", "protect") in found and ("backup/hooks", "protect") in found
