"""The agent lab shared by the agent-mode tests: the seed's fake home and project.

The lab: a home with ~/.fake-creds/token (FAKE-TOKEN), ~/.ssh/id_ed25519,
~/.aws/credentials and an unlisted ~/.config/sometool/secret; a project in
~/dev/demo-* with a git repository and a git-ignored nested one.  ``naive``
is the seed's first sandbox, the negative control of most agent-mode tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import IS_ROOT, Identity, _ensure_user


@dataclass
class Lab:
    home: Path
    project: Path
    token: str
    secrets: tuple[Path, ...]
    uid: int
    gid: int

    def own(self, *paths: Path) -> None:
        if IS_ROOT:
            for top in paths:
                for p in [top, *top.rglob("*")]:
                    os.lchown(p, self.uid, self.gid)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "safe.directory=*", *args],
                   cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def lab(who: Identity) -> Iterator[Lab]:
    if IS_ROOT:  # the agent runs as the project's owner: the test user, in its real home
        entry = _ensure_user()
        home, uid, gid = Path(entry.pw_dir), entry.pw_uid, entry.pw_gid
        home.mkdir(parents=True, exist_ok=True)
    else:
        home, uid, gid = who.tmp / "home", os.getuid(), os.getgid()
        home.mkdir()
        who.env["HOME"] = str(home)
    token = f"FAKE-TOKEN-{uuid.uuid4().hex}"
    files = {".fake-creds/token": token, ".ssh/id_ed25519": token, ".aws/credentials": token,
             ".config/sometool/secret": token, ".bashrc": "# rc\n"}
    for rel, text in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    project = home / "dev" / f"demo-{uuid.uuid4().hex[:8]}"
    (project / "nested").mkdir(parents=True)
    git(project, "init", "-q")
    (project / ".gitignore").write_text("nested/\n")
    git(project / "nested", "init", "-q")
    (project / ".env").write_text(f"API_KEY={token}\n")
    (project / "README.md").write_text("demo\n")
    made = [home / ".fake-creds", home / ".ssh", home / ".aws", home / ".config",
            home / ".bashrc", home / "dev"]
    result = Lab(home, project, token, tuple(home / r for r in files if "rc" not in r), uid, gid)
    result.own(*made)
    # corral's copies of agent state, and real state folders the tests make; and what
    # some tests plant in the (real) home
    made += [home / n for n in (".local", ".claude", ".claude.json", ".codex", ".pi", ".gemini",
                                ".aider", ".gitconfig", ".cargo", ".tools")]
    os.chmod(home, 0o755)
    yield result
    for p in made:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def agent(who: Identity, lab: Lab, script: str, *flags: str, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return who.corral("agent", *flags, "--", "/bin/sh", "-c", script, cwd=cwd or lab.project,
                      env=env)


def naive(who: Identity, lab: Lab, script: str, cwd: Path | None = None
          ) -> subprocess.CompletedProcess[str]:
    """The seed's first sandbox: everything read-only, the launch directory writable."""
    here = str(cwd or lab.project)
    return who.run(["bwrap", "--ro-bind", "/", "/", "--bind", here, here, "--unshare-pid",
                    "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--chdir", here,
                    "--", "/bin/sh", "-c", script], cwd=cwd or lab.project)
