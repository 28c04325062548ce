"""bwrap's version, read from the binary instead of starting it (a run's start saves ~2 ms).

What must hold: the same answer as ``bwrap --version``; anything that is not one
binary with one version string is asked by running it, as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from corral import host


def test_the_systems_bwrap_gives_the_same_version_either_way(bwrap: str) -> None:
    path = os.path.realpath(bwrap)
    read = host._version_in_binary(path)
    assert read is not None, "the system's bwrap holds its PACKAGE_STRING"
    printed = subprocess.run([path, "--version"], capture_output=True, text=True,
                             check=True).stdout.split()
    assert printed[0] == "bubblewrap" and ".".join(map(str, read)) == printed[1]
    assert read == host._version_by_running(path) == host._bwrap_version(path)


def test_a_wrapper_script_is_asked_by_running_it(tmp_path: Path, bwrap: str) -> None:
    script = tmp_path / "bwrap"
    script.write_text("#!/bin/sh\necho bubblewrap 9.1.2\n")
    script.chmod(0o755)
    assert host._version_in_binary(str(script)) is None
    assert host._bwrap_version(str(script)) == (9, 1, 2)  # control: running it answers
    copy = tmp_path / "bwrap-copy"  # control: the same bytes as the system's bwrap are read
    shutil.copy(os.path.realpath(bwrap), copy)
    assert host._version_in_binary(str(copy)) == host._version_by_running(str(copy))


def test_two_version_strings_or_a_fifo_are_not_read(tmp_path: Path) -> None:
    two = tmp_path / "two"
    two.write_bytes(b"\0bubblewrap 0.8.0\0junk\0bubblewrap 0.9.0\0")
    one = tmp_path / "one"
    one.write_bytes(b"\0bubblewrap 0.8.0\0junk\0")
    assert host._version_in_binary(str(one)) == (0, 8, 0)  # control
    assert host._version_in_binary(str(two)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert host._version_in_binary(str(fifo)) is None  # at once: no writer is waited for


def test_a_program_corral_runs_is_what_it_checked(tmp_path: Path) -> None:
    """host.system_program checked the file a PATH entry's link resolved to, and returned
    the link: a sandbox that could write that folder pointed the link at its own program
    between the check and the exec (found by review).  Now the checked file is returned.
    Control: a link to a program of a folder anyone can write is refused."""
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        git = shutil.which("git")
        assert git is not None
        (tmp_path / "git").symlink_to(os.path.realpath(git))
        mp.setenv("PATH", str(tmp_path))
        assert host.system_program("git") == os.path.realpath(git)
        mine = tmp_path / "mine"
        mine.mkdir()
        mine.chmod(0o777)
        (mine / "tool").write_text("#!/bin/sh\n")
        (mine / "tool").chmod(0o755)
        (tmp_path / "tool").symlink_to(mine / "tool")
        assert host.system_program("tool") is None
    finally:
        mp.undo()
