"""corral's private copy of each agent's state: nothing the sandbox writes reaches the real one.

Every agent loads code from its state folder (pi's extensions, Claude Code's hooks and MCP
servers, Codex's config.toml, Gemini CLI's extensions), and would run it with the user's
full rights the next time it starts outside corral.  Each test runs as root and as the
test user; each protection beside its control: the same write with the real state folder
bound through (``--rw``) lands where the agent outside corral reads it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from agent_lab import Lab, agent
from conftest import Identity

pytestmark = pytest.mark.sandbox

STORE = ".local/state/corral/agents"
# Per agent profile: its real state folder, and files the agent loads from there when it
# starts (code, or configuration that names code to run).
LOADED = {
    "claude": (".claude", ["settings.json", ".claude.json", "hooks/h.sh", "plugins/p/x.json"]),
    "codex": (".codex", ["config.toml", "hooks.json", "rules/r.rules", "skills/s/SKILL.md"]),
    "pi": (".pi", ["agent/extensions/evil.ts", "agent/settings.json", "agent/models.json"]),
    "gemini": (".gemini", ["extensions/x/gemini-extension.json", "settings.json", ".env"]),
    "aider": (".aider", ["caches/x", "oauth-keys.env"]),
}


def _plant(files: list[str], folder: str) -> str:
    return "; ".join(f"mkdir -p ~/{folder}/$(dirname {f}) && echo PLANTED > ~/{folder}/{f}"
                     for f in files) + " && echo ALL-WRITTEN"


@pytest.mark.parametrize("profile", sorted(LOADED))
def test_what_the_sandbox_writes_in_state_never_reaches_the_real_folder(
        who: Identity, lab: Lab, profile: str) -> None:
    folder, files = LOADED[profile]
    real = lab.home / folder
    r = agent(who, lab, _plant(files, folder), "--profile", profile)
    assert r.returncode == 0 and "ALL-WRITTEN" in r.stdout, r.stderr
    copy = lab.home / STORE / profile / folder
    for f in files:
        assert (copy / f).read_text() == "PLANTED\n"  # kept, in corral's copy...
        assert not (real / f).exists(), f  # ...and never in the real folder
    # Control: the real folder bound through on purpose is where the write lands, so an
    # agent started outside corral would load it.
    real.mkdir(exist_ok=True)
    lab.own(real)
    ctl = agent(who, lab, _plant(files, folder), "--profile", profile, "--rw", str(real))
    assert ctl.returncode == 0, ctl.stderr
    assert all((real / f).read_text() == "PLANTED\n" for f in files)


def _binds(dry_run: str) -> list[tuple[str, str]]:
    """(source, destination) of every writable bind in a --dry-run listing."""
    sources = dict(re.findall(r"^# fd (\d+): (.*)$", dry_run, re.M))
    return [(sources[fd], dest) for fd, dest in
            re.findall(r"^  --bind-fd (\d+) (\S+)$", dry_run, re.M)]


@pytest.mark.parametrize("profile", ["claude", "codex", "pi", "gemini", "aider", "generic"])
def test_every_writable_mount_is_the_project_or_corrals_copy(who: Identity, lab: Lab,
                                                             profile: str) -> None:
    """Structural: whatever the agent could load outside corral is never bound writable."""
    for folder, _ in LOADED.values():  # the real folders exist: they must stay out
        (lab.home / folder).mkdir(exist_ok=True)
    lab.own(*(lab.home / f for f, _ in LOADED.values()))
    r = who.corral("agent", "--dry-run", "--profile", profile, "--", "/bin/true",
                   cwd=lab.project)
    assert r.returncode == 0, r.stderr
    binds = _binds(r.stdout)
    assert binds, r.stdout
    store = f"{lab.home}/{STORE}/{profile}/"
    for source, dest in binds:
        in_project = source.startswith(f"{lab.project}") and source == dest
        in_copy = source.startswith(store) and dest == f"{lab.home}/{source[len(store):]}"
        assert in_project or in_copy, (source, dest)
    folder = LOADED.get(profile, ("", []))[0]
    if folder:
        assert (f"{store}{folder}", f"{lab.home}/{folder}") in binds
    # Control: --rw of the real folder shows up as a writable bind of the real path.
    if folder:
        ctl = who.corral("agent", "--dry-run", "--profile", profile, "--rw",
                         str(lab.home / folder), "--", "/bin/true", cwd=lab.project)
        assert (str(lab.home / folder),) * 2 in _binds(ctl.stdout)


def _claude_state(lab: Lab) -> tuple[Path, Path]:
    real = lab.home / ".claude"
    real.mkdir(exist_ok=True)
    (real / "settings.json").write_text('{"model": "mine"}\n')
    (real / ".credentials.json").write_text("TOKEN-1\n")
    (real / "projects").mkdir(exist_ok=True)
    (real / "projects" / "history.jsonl").write_text("old transcript\n")
    (lab.home / ".claude.json").write_text('{"numStartups": 7}\n')
    lab.own(real, lab.home / ".claude.json")
    return real, lab.home / STORE / "claude" / ".claude"


def test_first_use_imports_settings_and_every_launch_refreshes_the_login(
        who: Identity, lab: Lab) -> None:
    real, copy = _claude_state(lab)
    show = ("cat ~/.claude/settings.json ~/.claude/.claude.json ~/.claude/.credentials.json; "
            "ls ~/.claude/projects 2>&1; echo $CLAUDE_CONFIG_DIR")
    r = agent(who, lab, show + "; echo TOKEN-INSIDE > ~/.claude/.credentials.json; "
              "echo '{}' > ~/.claude/settings.json", "--profile", "claude")
    assert r.returncode == 0, r.stderr
    assert '{"model": "mine"}' in r.stdout and '"numStartups": 7' in r.stdout
    assert "TOKEN-1" in r.stdout and "No such file" in r.stdout  # no history copied
    assert r.stdout.strip().endswith(str(real)) and "imported into corral's copy" in r.stderr
    assert (real / ".credentials.json").read_text() == "TOKEN-1\n"  # never written back
    assert (copy / ".credentials.json").stat().st_mode & 0o077 == 0
    # The next launch: the login again from the real file, the copy's settings kept.
    (real / ".credentials.json").write_text("TOKEN-2\n")
    again = agent(who, lab, show, "--profile", "claude")
    assert "TOKEN-2" in again.stdout and '{"model": "mine"}' not in again.stdout
    assert "imported" not in again.stderr
    # --import-state brings the real settings back.
    imported = agent(who, lab, show, "--profile", "claude", "--import-state")
    assert '{"model": "mine"}' in imported.stdout and "imported" in imported.stderr


def test_a_link_planted_in_the_copy_is_replaced_never_followed(who: Identity, lab: Lab) -> None:
    """The sandbox turns the copy's credentials file into a link to ~/.bashrc; the next
    launch's refresh replaces the link and leaves ~/.bashrc alone."""
    real, copy = _claude_state(lab)
    plant = "ln -sf $HOME/.bashrc ~/.claude/.credentials.json && echo LINKED"
    r = agent(who, lab, plant, "--profile", "claude")
    assert "LINKED" in r.stdout and (copy / ".credentials.json").is_symlink()
    assert (copy / ".credentials.json").resolve() == (lab.home / ".bashrc")
    again = agent(who, lab, "cat ~/.claude/.credentials.json", "--profile", "claude")
    assert again.returncode == 0 and "TOKEN-1" in again.stdout, again.stderr
    assert (lab.home / ".bashrc").read_text() == "# rc\n"
    assert not (copy / ".credentials.json").is_symlink()
    # Control: a copy by path (what a plain shutil.copy does) follows the link.
    os.remove(copy / ".credentials.json")
    os.symlink(lab.home / ".bashrc", copy / ".credentials.json")
    shutil.copyfile(real / ".credentials.json", copy / ".credentials.json")
    assert (lab.home / ".bashrc").read_text() == "TOKEN-1\n"
    (lab.home / ".bashrc").write_text("# rc\n")


def test_a_symlinked_real_file_is_not_imported(who: Identity, lab: Lab) -> None:
    real, _ = _claude_state(lab)
    (real / "settings.json").unlink()
    (real / "settings.json").symlink_to(lab.home / ".fake-creds" / "token")
    lab.own(real)
    r = agent(who, lab, "cat ~/.claude/settings.json 2>&1; true", "--profile", "claude")
    assert r.returncode == 0 and lab.token not in r.stdout, r.stdout
    assert "not imported ~/.claude/settings.json" in r.stderr


def test_nothing_may_be_mounted_inside_the_copy(who: Identity, lab: Lab) -> None:
    inner = lab.home / ".claude" / "work"
    inner.mkdir(parents=True)
    lab.own(lab.home / ".claude")
    r = who.corral("agent", "--profile", "claude", "--", "/bin/true", cwd=inner)
    assert r.returncode == 125 and "corral mounts its private copy" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    ok = who.corral("agent", "--profile", "generic", "--", "/bin/true", cwd=inner)
    assert ok.returncode == 0, ok.stderr  # control: no copy there, no refusal
