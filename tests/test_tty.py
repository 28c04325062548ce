"""The user's terminal stays the user's (corral.tty), in a real terminal: tmux.

Each test types into a tmux pane whose shell (as root, or as the test user) starts corral,
and reads the screen back.  The controls run the same payload the way corral did before
this protection: bwrap with ``--new-session`` and the user's terminal passed through.
"""

from __future__ import annotations

import base64
import os
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_lab import Lab
from conftest import IS_ROOT, Identity
from terminal import WAIT_S, Pane

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("each_init")]


@pytest.fixture
def pane(who: Identity, lab: Lab) -> Iterator[Pane]:
    if IS_ROOT and not who.is_root:
        os.chmod(who.tmp, 0o755)
    p = Pane(who, lab.project)
    yield p
    p.close()


def _corral(who: Identity, *args: str) -> str:
    return shlex.join([*who.prefix()[-1:], "-m", "corral", *args])


def _naive(lab: Lab, script: str) -> str:
    """The payload the way corral ran it before: the user's terminal passed through."""
    here = str(lab.project)
    return shlex.join(["bwrap", "--ro-bind", "/", "/", "--bind", here, here, "--unshare-pid",
                       "--dev", "/dev", "--proc", "/proc", "--new-session",
                       "--die-with-parent", "--chdir", here, "--", "/bin/sh", "-c", script])


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


LOOP = ("(while :; do date +%s%N >> beat; sleep 0.1; done) & "
        "while read -r l; do echo \"$l\" >> typed; done")


def _suspend_and_type(pane: Pane, lab: Lab, start: str) -> tuple[str, bool, list[int]]:
    """Start the loop, suspend it with ^Z, type to the shell.  Returns what the payload
    read, whether its heartbeat went on while suspended, and the sandbox's processes that
    hold the user's terminal."""
    typed, beat = lab.project / "typed", lab.project / "beat"
    pane.line(start)
    _until(lambda: _lines(beat) > 2, "the payload never started")
    pane.line("line-before")
    _until(lambda: "line-before" in (typed.read_text() if typed.exists() else ""),
           "the payload never read its own input")
    pane.keys("C-z")
    pane.wait(lambda s: "Stopped" in s)
    time.sleep(1)
    count = _lines(beat)
    holders = pane.holders()
    pane.line("sleep 3")
    time.sleep(0.5)
    pane.line("echo typed-to-my-shell")
    time.sleep(4)
    running = _lines(beat) > count + 3
    return typed.read_text(), running, holders


def test_ctrl_z_freezes_the_run_and_it_reads_nothing_typed_to_the_shell(
        who: Identity, lab: Lab, pane: Pane) -> None:
    lab.own(lab.project)
    read, running, holders = _suspend_and_type(pane, lab, _corral(who, "agent", "--",
                                                                  "/bin/sh", "-c", LOOP))
    assert "typed-to-my-shell" not in read and not running and not holders, (read, holders)
    pane.wait(lambda s: s.count("typed-to-my-shell") >= 2)  # the shell got the line
    pane.line("fg")
    time.sleep(1)
    pane.line("line-after")
    _until(lambda: "line-after" in (lab.project / "typed").read_text(), "fg did not resume")
    count = _lines(lab.project / "beat")
    _until(lambda: _lines(lab.project / "beat") > count + 3, "the run stayed frozen")
    pane.keys("C-c")  # ^C reaches the payload through corral's terminal
    pane.wait(lambda s: s.rstrip().endswith("host$"))
    # Control: bwrap alone, the terminal passed through: the sandbox runs on, holding the
    # user's terminal (what it then reads of the lines typed to the shell is a race).
    for name in ("typed", "beat"):
        (lab.project / name).unlink()
    _, running, holders = _suspend_and_type(pane, lab, _naive(lab, LOOP))
    assert running and holders


# Its own terminal is dead after this, so it says what happened in a file; then it stays
# a moment, for the test to see which terminal it holds.
SETD = ("import fcntl, struct, sys, time\n"
        "try:\n"
        "    fcntl.ioctl(0, 0x5423, struct.pack('i', 27))  # TIOCSETD, N_NULL\n"
        "    said = 'SETD-DONE'\n"
        "except OSError as e:\n"
        "    said = f'SETD-REFUSED {e}'\n"
        "open(sys.argv[1], 'w').write(said)\n"
        "time.sleep(2)\n")


def test_a_payload_that_kills_its_terminal_leaves_the_users_working(
        who: Identity, lab: Lab, pane: Pane) -> None:
    script = lab.project / "setd.py"
    script.write_text(SETD)
    lab.own(script)
    said = lab.project / "setd.out"
    pane.line(_corral(who, "shell", "--", "/usr/bin/python3", str(script), str(said)))
    _until(said.exists, "the payload never ran")
    # The sandbox holds corral's pty, not the user's terminal, whatever the ioctl did
    # (seccomp's list of terminal requests may refuse it; the relay does not depend on it).
    assert said.read_text().startswith("SETD-") and not pane.holders()
    pane.wait(lambda s: s.count("host$") >= 2)  # corral is gone: keys go to the shell now
    pane.line("echo alive-$((2+3)); stty -a | grep -o -- '-\\?icanon'")
    text = pane.wait(lambda s: "alive-5" in s)
    assert "-icanon" not in text.split("alive-5")[-1]  # its modes restored, too
    # Control: with the user's terminal passed through, the same ioctl kills it.
    said.unlink()
    pane.line(_naive(lab, f"/usr/bin/python3 {script} {said}"))
    _until(said.exists, "the control never ran")
    assert said.read_text() == "SETD-DONE" and pane.holders()
    pane.line("echo dead-$((3+4))")
    time.sleep(3)
    assert "dead-7" not in pane.screen()


def test_the_terminal_is_restored_when_corral_is_killed(who: Identity, lab: Lab,
                                                        pane: Pane) -> None:
    marker = f"corral-tty-{uuid.uuid4().hex[:8]}"
    pane.line(_corral(who, "shell", "-c", f"stty raw -echo; sleep 300; : {marker}"))
    _until(lambda: _main_corral(marker) is not None, "corral never started")
    time.sleep(2)
    pid = _main_corral(marker)
    assert pid is not None
    os.kill(pid, 15)
    pane.wait(lambda s: "host$" in s.split(marker)[-1])
    pane.line("stty -a | grep -o -- '-\\?echo ' | head -1; echo done-$((1+1))")
    text = pane.wait(lambda s: "done-2" in s)
    assert "-echo " not in text.split("done-2")[0].split("stty -a")[-1]


def _main_corral(marker: str) -> int | None:
    """corral's own process for the run whose command line carries ``marker``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
            except OSError:
                continue
            if b"corral" in words and any(marker.encode() in w for w in words) \
                    and b"bwrap" not in words[0]:
                return int(entry)
    return None


def test_the_payload_cannot_set_the_users_clipboard(who: Identity, lab: Lab,
                                                   pane: Pane) -> None:
    """OSC 52 in the payload's output sets the clipboard of the terminal it reaches: here
    tmux's (``set-clipboard on``), which keeps it as a paste buffer, as a desktop terminal
    keeps it for the next paste into a shell.  Through corral's relay it never arrives
    (corral.termout), also wrapped in tmux's passthrough; control: the same printf with
    the user's terminal passed through sets the buffer."""
    plant = base64.b64encode(f"echo planted-{uuid.uuid4().hex[:6]}".encode()).decode()
    pane.tmux("set", "-g", "set-clipboard", "on")
    pane.tmux("set", "-g", "allow-passthrough", "on")
    printf = r"printf '\033]52;c;%s\a\033Ptmux;\033\033]52;c;%s\a\033\\'" + \
        f" {plant} {plant}; echo printed-$((4+4))"
    pane.line(_corral(who, "shell", "-c", printf))
    pane.wait(lambda s: "printed-8" in s and s.count("host$") >= 2)
    assert pane.tmux("list-buffers") == ""
    pane.line(_naive(lab, printf))
    pane.wait(lambda s: s.count("printed-8") >= 2)
    time.sleep(1)
    assert base64.b64decode(plant).decode() in pane.tmux("show-buffer")


def test_non_interactive_runs_keep_pipes(who: Identity, lab: Lab) -> None:
    r = who.corral("shell", "-c", "test -t 0 || test -t 1 || echo PIPES", cwd=lab.project)
    assert r.returncode == 0 and r.stdout == "PIPES\n", r


def test_a_v2_cgroup_is_frozen_through_cgroup_freeze(tmp_path: Path) -> None:
    """The v2 path, on a stand-in directory: this kind of machine has no v2 controllers."""
    from corral.tty import Freezer

    (tmp_path / "cgroup.freeze").write_text("0")
    f = Freezer(lambda: None, v2_dir=str(tmp_path))
    f.freeze()
    assert (tmp_path / "cgroup.freeze").read_text() == "1"
    f.close()
    assert (tmp_path / "cgroup.freeze").read_text() == "0"
