"""git's in-progress state as a way out of agent mode.

The agent may rebase, cherry-pick and apply patches, so ``.git`` stays writable; but a
half-finished operation leaves state that the host's git resumes later, outside any
sandbox, when the user runs what ``git status`` suggests.  Each test plants one such state
in a real ``corral agent`` run, then runs the user's command with host git 2.39 as the
identity under test (root and the plain user); the planted command would write a marker
in the home directory, which the sandbox cannot see.  Each has its negative control: the
same plant under the seed's naive sandbox, after which host git writes the marker.  A
last test holds the other side: a plain half-finished rebase still continues.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_lab import Lab, agent, git, naive
from conftest import Identity

pytestmark = pytest.mark.sandbox

ID = "-c user.name=u -c user.email=u@example.invalid"
# Three commits: a (f=1), b (f=2), c (adds g).  Picking c onto a alone needs a real merge.
HISTORY = ("export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'; "
           f"echo 1 > f && git add f && git {ID} commit -qm a && echo 2 > f && "
           f"git {ID} commit -qam b && echo 3 > g && git add g && git {ID} commit -qm c && ")
STOP = "GIT_SEQUENCE_EDITOR=\"sed -i -e '1i break' -e '/ b$/d'\" "
# A program the work tree holds, run through a strategy name git turns into a path:
# "git-merge-" + "x/../evil" is the relative path git-merge-x/../evil.
EVIL = ("mkdir -p git-merge-x && printf '#!/bin/sh\\ntouch \"$MARK\"\\nexit 2\\n' > evil && "
        "chmod 755 evil && ")


def _plants(mark: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name: (the agent's script, the host command the user then runs)."""
    rebase = f"{HISTORY}{STOP}git {ID} rebase -q -i HEAD~2; "
    return {
        # a todo line the host's rebase runs through the shell
        "exec": (f"{rebase}echo 'exec touch {mark}' >> .git/rebase-merge/git-rebase-todo",
                 ("rebase", "--continue")),
        "x": (f"{rebase}printf ' \\tx touch {mark}\\n' >> .git/rebase-merge/git-rebase-todo",
              ("rebase", "--continue")),
        # the rebase's merge strategy, a program git looks up by name
        "strategy": (f"{rebase}{EVIL.replace('$MARK', str(mark))}"
                     "echo x/../evil > .git/rebase-merge/strategy", ("rebase", "--continue")),
        # a cherry-pick's options, read as a config file
        "sequencer": (f"{HISTORY}git checkout -q -b side && git reset -q --hard HEAD~2 && "
                      f"echo 9 > f && git {ID} commit -qam m; git {ID} cherry-pick side~1 side"
                      f"; git checkout -q --theirs f && git add f && "
                      f"{EVIL.replace('$MARK', str(mark))}"
                      "git config -f .git/sequencer/opts options.strategy x/../evil",
                      ("-c", "core.editor=true", "cherry-pick", "--continue")),
        # git am's options for git apply: --build-fake-ancestor writes where it says
        "am": (f"{HISTORY}git format-patch -q -2 -o patches && git reset -q --hard HEAD~2"
               f" && echo 9 > f && git {ID} commit -qam m; git {ID} am patches/*; "
               f"echo \"'--build-fake-ancestor={mark}'\" > .git/rebase-apply/apply-opt",
               ("am", "--skip")),
    }


def _host_git(who: Identity, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return who.run(["git", "-c", "safe.directory=*", "-c", "user.name=u", "-c",
                    "user.email=u@example.invalid", *args], cwd=cwd)


def _fresh(lab: Lab) -> Path:
    """The lab's project with no history and nothing beside it."""
    project = lab.project
    for p in project.iterdir():
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    shutil.rmtree(project / ".git")
    git(project, "init", "-q")
    lab.own(project)
    return project


@pytest.mark.parametrize("plant", ["exec", "x", "strategy", "sequencer", "am"])
def test_state_that_would_run_a_command_does_not_survive_the_run(who: Identity, lab: Lab,
                                                                 plant: str) -> None:
    mark = lab.home / f"MARK-{plant}"
    script, command = _plants(mark)[plant]
    mark.unlink(missing_ok=True)
    project = _fresh(lab)
    r = agent(who, lab, f"{script}; echo PLANTED")
    assert "PLANTED" in r.stdout, r
    ran = _host_git(who, project, *command)
    assert not mark.exists(), (ran, r.stderr)
    assert "quarantined" in r.stderr and "would run" in r.stderr, r.stderr
    # Control: the naive sandbox plants the same, and host git runs it.
    project = _fresh(lab)
    naive(who, lab, script)
    ran = _host_git(who, project, *command)
    assert mark.exists(), ran
    mark.unlink()


def test_a_worktrees_own_state_is_audited_too(who: Identity, lab: Lab) -> None:
    """A linked worktree keeps its rebase in ``.git/worktrees/NAME/rebase-merge``: the
    agent can write it (that git directory is pinned writable) and git resumes it there."""
    mark = lab.home / "MARK-worktree"
    mark.unlink(missing_ok=True)
    script = f"cd wt && {HISTORY}{STOP}git {ID} rebase -q -i HEAD~2; " \
             f"echo 'exec touch {mark}' >> \"$(git rev-parse --git-dir)/rebase-merge/" \
             "git-rebase-todo\"; echo PLANTED"
    for sandbox in ("corral", "naive"):
        project = _fresh(lab)
        git(project, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit",
            "-q", "--allow-empty", "-m", "root")
        git(project, "worktree", "add", "-q", "wt")
        lab.own(project)
        r = agent(who, lab, script) if sandbox == "corral" else naive(who, lab, script)
        assert "PLANTED" in r.stdout, r
        ran = _host_git(who, project / "wt", "rebase", "--continue")
        # Control: after the naive sandbox, host git runs the planted line.
        assert mark.exists() == (sandbox == "naive"), (sandbox, ran, r.stderr)
        mark.unlink(missing_ok=True)


def test_a_plain_rebase_and_the_users_own_exec_lines_still_continue(who: Identity, lab: Lab
                                                                   ) -> None:
    """The other side: an agent's half-finished rebase without commands, and a rebase the
    user left with ``-x`` before the run (its todo changed by the agent, its commands not),
    stay where they are and continue on the host."""
    project = _fresh(lab)
    r = agent(who, lab, f"{HISTORY}{STOP}git {ID} rebase -q -i HEAD~2; echo PLANTED")
    assert "PLANTED" in r.stdout and "quarantined" not in r.stderr, r
    ran = _host_git(who, project, "rebase", "--continue")
    assert ran.returncode == 0 and not (project / ".git" / "rebase-merge").exists(), ran
    mark = lab.home / "MARK-users-own"
    mark.unlink(missing_ok=True)
    project = _fresh(lab)
    subprocess.run(["sh", "-c", f"{HISTORY}{STOP}git {ID} rebase -q -i -x 'touch {mark}' "
                    "HEAD~2"], cwd=project, check=False, capture_output=True)
    lab.own(project)
    todo = project / ".git" / "rebase-merge" / "git-rebase-todo"
    assert f"exec touch {mark}" in todo.read_text()
    r = agent(who, lab, "echo '# the agent was here' >> .git/rebase-merge/git-rebase-todo "
              "&& echo PLANTED")
    assert "PLANTED" in r.stdout and "quarantined" not in r.stderr, r
    ran = _host_git(who, project, "rebase", "--continue")
    assert ran.returncode == 0 and mark.exists(), ran
    mark.unlink()
