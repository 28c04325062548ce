"""Agent mode against the red-team review's attacks, each with its negative control.

Each test reproduces an attack that worked against an earlier corral (or a
closely related one), shows it failing under corral, and shows it working in
the seed's naive sandbox or without the protection in question.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent_lab import Lab, agent, git, naive
from conftest import Identity

pytestmark = pytest.mark.sandbox


def _commit(path: Path) -> None:
    (path / "f").write_text("x\n")
    git(path, "add", "f")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")


def test_a_commondir_cannot_be_planted_in_git(who: Identity, lab: Lab) -> None:
    plant = "cat .git/commondir; (echo ../.cache/c > .git/commondir) 2>/dev/null && echo WROTE;" \
            " true"
    r = agent(who, lab, plant)
    # Corral's read-only placeholder, naming the git directory itself, is there...
    assert r.returncode == 0 and r.stdout == ".\n", r
    assert not (lab.project / ".git" / "commondir").exists()  # ...and gone after the run
    assert "quarantined" not in r.stderr and "removed" not in r.stderr, r.stderr
    # Control: the naive sandbox leaves it, and the host's git would obey it.
    naive(who, lab, plant)
    assert (lab.project / ".git" / "commondir").exists()
    (lab.project / ".git" / "commondir").unlink()
    # A main git directory that already holds one is refused before anything starts.
    (lab.project / ".git" / "commondir").write_text("../x\n")
    lab.own(lab.project)
    refused = agent(who, lab, "true")
    assert refused.returncode == 125 and "commondir" in refused.stderr


def test_no_new_submodule_or_worktree_git_directory(who: Identity, lab: Lab) -> None:
    script = ("(mkdir -p .git/modules/evil && echo x > .git/modules/evil/config) 2>/dev/null "
              "&& echo MODULE; (mkdir -p .git/worktrees/evil) 2>/dev/null && echo WORKTREE; true")
    r = agent(who, lab, script)
    assert r.returncode == 0 and "MODULE" not in r.stdout and "WORKTREE" not in r.stdout
    ctl = naive(who, lab, script)
    assert "MODULE" in ctl.stdout and "WORKTREE" in ctl.stdout


def test_a_separate_git_directory_is_protected_too(who: Identity, lab: Lab) -> None:
    repo = lab.project / "sep"
    repo.mkdir()
    git(repo, "init", "-q", "--separate-git-dir", str(lab.project / "sep-data"))
    lab.own(lab.project)
    script = "(echo x >> sep-data/config) 2>/dev/null && echo WROTE; true"
    r = agent(who, lab, script)
    assert r.returncode == 0 and "WROTE" not in r.stdout, r.stdout + r.stderr
    assert "WROTE" in naive(who, lab, script).stdout


def test_hard_linked_control_files_and_secrets_are_refused(who: Identity, lab: Lab) -> None:
    os.link(lab.project / ".git" / "config", lab.project / "notes.txt")
    lab.own(lab.project)
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "hard link" in r.stderr
    # Control: the same write through the other name reaches git's config.
    naive(who, lab, "echo '[core] fsmonitor = evil' >> notes.txt")
    assert "fsmonitor" in (lab.project / ".git" / "config").read_text()
    (lab.project / "notes.txt").unlink()
    os.link(lab.project / ".env", lab.project / "docs.txt")
    assert agent(who, lab, "true").returncode == 125
    (lab.project / "docs.txt").unlink()
    (lab.project / ".env.production").symlink_to("docs-sym.txt")
    lab.own(lab.project)
    linked = agent(who, lab, "true")
    assert linked.returncode == 125 and "symbolic link" in linked.stderr


def test_hook_locations_named_by_git_config_are_read_only(who: Identity, lab: Lab) -> None:
    _commit(lab.project)
    (lab.project / "tools" / "hooks").mkdir(parents=True)
    (lab.project / "tools" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    git(lab.project, "config", "core.hooksPath", "tools/hooks")
    (lab.project / ".pre-commit-config.yaml").write_text("repos: []\n")
    lab.own(lab.project)
    script = ("(echo evil >> tools/hooks/pre-commit) 2>/dev/null && echo HOOK; "
              "(echo evil >> .pre-commit-config.yaml) 2>/dev/null && echo MANAGER; true")
    r = agent(who, lab, script)
    assert r.returncode == 0 and "HOOK" not in r.stdout and "MANAGER" not in r.stdout
    ctl = naive(who, lab, script)
    assert "HOOK" in ctl.stdout and "MANAGER" in ctl.stdout


def test_a_read_only_path_inside_a_writable_folder_stays_read_only(who: Identity,
                                                                   lab: Lab) -> None:
    """--ro inside --rw: the real state folder bound through on purpose, its settings kept."""
    settings = lab.home / ".claude" / "settings.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text("{}\n")
    lab.own(lab.home / ".claude")
    script = (f"(echo hooks > {settings}) 2>/dev/null && echo SETTINGS; "
              f"echo state > {settings.parent}/history.jsonl && echo STATE")
    r = agent(who, lab, script, "--rw", str(settings.parent), "--ro", str(settings))
    assert r.returncode == 0 and "SETTINGS" not in r.stdout and "STATE" in r.stdout, r
    assert settings.read_text() == "{}\n"
    # Control: the folder writable (--rw) without the read-only path: rewritten.
    ctl = agent(who, lab, script, "--rw", str(settings.parent))
    assert "SETTINGS" in ctl.stdout


@pytest.mark.usefixtures("each_init")  # the init checks the mounts
def test_a_mount_that_landed_elsewhere_stops_the_launch(who: Identity, lab: Lab,
                                                        readable_src: Path) -> None:
    """The init's own check, as when a racing sandbox swapped a folder during setup."""
    script = (
        "import sys, json\n"
        "from corral import agent, host, launch\n"
        "from corral.profiles import load_profile\n"
        "policy = load_profile('generic')\n"
        "sb, _ = agent.resolve_agent(policy, ['/bin/true'], host.detect(), sys.argv[1],\n"
        "                            prepare=True)\n"
        "expect = [list(e) for e in sb.init_config['expect_mounts']]\n"
        "if sys.argv[2] == 'tamper':  # as if .git's pin had landed on another folder\n"
        "    next(e for e in expect if e[1] == 'pin')[3] += 1\n"
        "from corral.record import replace\n"
        "sb = replace(sb, init_config={**sb.init_config, 'expect_mounts': expect})\n"
        "try:\n"
        "    out = launch.launch(sb, capture=True, stdin=None, output_cap=1 << 16,\n"
        "                        timeout_s=60, bwrap_path=host.detect().require_bwrap())\n"
        "    print('STARTED', out.exit_code)\n"
        "except Exception as e:\n"
        "    print('REFUSED', e)\n")
    runner = lab.home / "dev" / "race.py"
    runner.write_text(script)
    lab.own(runner)

    def attempt(mode: str) -> str:
        python = who.prefix()[-1]
        done = who.run([python, str(runner), str(lab.project), mode], cwd=lab.project)
        return done.stdout + done.stderr
    assert "REFUSED" in attempt("tamper") and "not re-mounted" in attempt("tamper")
    assert "STARTED 0" in attempt("honest")  # control: the same launch, untampered


def test_root_runs_the_agent_with_the_owners_own_group(root: Identity, lab: Lab) -> None:
    os.chown(lab.project, lab.uid, 0)  # what a plain "chown user dir" by root leaves
    r = root.corral("agent", "--", "/bin/sh", "-c", "id -u; id -g", cwd=lab.project)
    assert r.returncode == 0 and r.stdout.split() == [str(lab.uid), str(lab.gid)], r


def test_a_second_path_to_home_is_still_home(root: Identity, lab: Lab) -> None:
    assert shutil.which("unshare") is not None
    alias = root.tmp / "homebind"
    alias.mkdir()
    root.tmp.chmod(0o711)  # the agent (the owner) can reach a project there on the host
    cmd = (f"mount --bind {lab.home} {alias} && cd {alias} && "
           f"exec {' '.join(root.prefix())} -m corral agent -- /bin/true")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                       env=root.environ(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 125 and "home directory" in r.stderr, r
    # Control: the same bind of a project directory is accepted.
    cmd = cmd.replace(str(lab.home), str(lab.project))
    ok = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                        env=root.environ(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok


KEYED = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(250, 1, None)  # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a fresh session keyring
if libc.syscall(248, b"user", sys.argv[1].encode(), b"secret", 6, -3) < 0:  # add_key to @s
    sys.exit("add_key failed: " + os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[2], sys.argv[2:])
"""


def test_key_descriptions_are_not_listed(who: Identity, lab: Lab) -> None:
    """The launcher's session keyring holds a key; its description must not show inside."""
    keyed = lab.home / "dev" / "keyed.py"
    keyed.write_text(KEYED)
    lab.own(keyed)
    desc = f"corral-test-key-{os.getpid()}"
    show = ["/bin/sh", "-c", "cat /proc/keys /proc/key-users; echo end"]
    python = who.prefix()[-1]
    r = who.run([python, str(keyed), desc, python, "-m", "corral", "agent", "--", *show],
                cwd=lab.project)
    assert r.returncode == 0 and "end" in r.stdout and desc not in r.stdout, r
    here = str(lab.project)
    ctl = who.run([python, str(keyed), desc, "bwrap", "--ro-bind", "/", "/", "--bind", here,
                   here, "--unshare-pid", "--dev", "/dev", "--proc", "/proc", "--", *show],
                  cwd=lab.project)
    assert desc in ctl.stdout, ctl


def test_names_that_are_not_utf8_do_not_break_the_launch(who: Identity, lab: Lab) -> None:
    odd = os.fsencode(lab.project) + b"/\xff"
    os.mkdir(odd)
    with open(odd + b"/.env", "w") as f:
        f.write("S=1\n")
    lab.own(lab.project)
    r = agent(who, lab, "cat \"$(printf '\\377')/.env\" | wc -c")
    assert r.returncode == 0 and r.stdout.strip() == "0", r


def test_agent_and_shell_have_process_limits(who: Identity, lab: Lab) -> None:
    spawn = ("n=0; for i in $(seq 100); do (sleep 5 &) 2>/dev/null && n=$((n+1)); done; "
             "sleep 1; ls /proc | grep -c '^[0-9]'")
    r = who.corral("shell", "--pids", "32", "-c", spawn, cwd=lab.project)
    assert r.returncode == 0 and int(r.stdout.split()[-1]) <= 40, r
    ctl = who.corral("shell", "--pids", "1000", "-c", spawn, cwd=lab.project)
    assert int(ctl.stdout.split()[-1]) >= 100, ctl
