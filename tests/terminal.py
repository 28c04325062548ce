"""A real terminal for tests: a tmux pane running an interactive shell, typed into and read."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from conftest import Identity, need

WAIT_S = 60.0  # generous: a loaded two-core machine


class Pane:
    """One tmux session on a private server socket, running an interactive shell."""

    def __init__(self, who: Identity, cwd: Path, env: dict[str, str] | None = None) -> None:
        need(shutil.which("tmux") is not None, "tmux is not installed")
        self.socket = str(who.tmp / f"tmux-{uuid.uuid4().hex[:6]}")
        words = " ".join(f"{k}={shlex.quote(v)}" for k, v in who.environ(env).items())
        run_as = "" if who.uid == os.geteuid() else \
            f"setpriv --reuid={who.uid} --regid={who.gid} --clear-groups -- "
        shell = (f"{run_as}env -i TERM=screen {words} PS1='host$ ' HISTFILE= "
                 "bash --norc --noprofile -i")
        self.tmux("new-session", "-d", "-s", "t", "-x", "150", "-y", "40", "-c", str(cwd),
                  shell)
        self.wait(lambda s: "host$" in s)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def line(self, text: str) -> None:
        self.tmux("send-keys", "-t", "t", "-l", text)
        self.keys("Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "t")

    def wait(self, done: Callable[[str], bool], timeout: float = WAIT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if done(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"the screen never showed it:\n{self.screen()}")

    def holders(self) -> list[int]:
        """Processes in another PID namespace (a sandbox) that hold this pane's terminal."""
        tty = self.tmux("display", "-p", "-t", "t", "#{pane_tty}").strip()
        mine = os.readlink("/proc/self/ns/pid")
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == mine:
                    continue
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") == tty for fd in (0, 1, 2)):
                    found.append(int(pid))
            except OSError:
                continue
        return found

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)
