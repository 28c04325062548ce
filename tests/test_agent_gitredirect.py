"""What in ``.git`` sends host git elsewhere, planted from agent mode.

Each test plants, from a real ``corral agent`` run, a file host git 2.39 obeys outside
the config: a legacy remote (``remotes/origin``, ``branches/origin``), a replace ref
(loose or packed), grafts, alternates; then runs, as the identity under test (root and
the plain user), the command a user would: ``git push`` with no remote configured, ``git
show`` of what is about to be pushed, ``git cat-file``.  A local bare repository stands
for the attacker's server.  Each has its negative control: the same plant under the
seed's naive sandbox, after which host git pushes there, shows the other commit, or
reads the other store.  The agent's own work (its commits, branches, packed refs) stays.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from agent_lab import Lab, agent, git, naive
from conftest import Identity
from test_agent_gitstate import ID, _fresh, _host_git

pytestmark = pytest.mark.sandbox


SAFE = "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'; "


def _project(lab: Lab) -> Path:
    """The lab's project with one commit (f=ok) on main and no remote."""
    project = _fresh(lab)
    (project / "f").write_text("ok\n")
    git(project, "add", "f")
    git(project, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qm",
        "base")
    lab.own(project)
    return project


def _plant(who: Identity, lab: Lab, sandbox: str, script: str) -> str:
    """Run the agent's ``script`` in ``sandbox`` (corral or the naive one): its stderr."""
    run = agent if sandbox == "corral" else naive
    r = run(who, lab, f"{SAFE}{script} && echo PLANTED")
    assert "PLANTED" in r.stdout, (sandbox, r)
    return r.stderr


@pytest.mark.parametrize("legacy", ["remotes", "branches"])
def test_a_legacy_remote_does_not_take_over_git_push(who: Identity, lab: Lab, legacy: str
                                                      ) -> None:
    """No remote in the config: a plain ``git push`` goes to ``origin``, which git then
    takes from ``.git/remotes/origin`` or ``.git/branches/origin``."""
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        attacker = lab.home / "dev" / f"attacker-{uuid.uuid4().hex[:8]}.git"
        who.run(["git", "init", "-q", "--bare", str(attacker)])  # the identity's own
        stderr = _plant(who, lab, sandbox, (
            f"mkdir -p .git/remotes && printf 'URL: {attacker}\\nPush: refs/heads/*:"
            "refs/heads/*\\n' > .git/remotes/origin" if legacy == "remotes" else
            f"mkdir -p .git/branches && echo {attacker} > .git/branches/origin"))
        pushed = _host_git(who, project, "push")
        sent = _host_git(who, attacker, "for-each-ref")
        # Control: after the naive sandbox, the user's code lands in the agent's repository.
        assert bool(sent.stdout.strip()) == (sandbox == "naive"), (sandbox, pushed, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "legacy remote" in stderr, stderr


# The agent commits EVIL, then makes a replacement (GOOD) that host git shows instead.
REPLACE = (f"echo EVIL > f && git {ID} commit -qam change && bad=$(git rev-parse HEAD) && "
           f"echo GOOD > f && git add f && good=$(git {ID} commit-tree $(git write-tree) "
           "-p HEAD~1 -m change) && git replace $bad $good && git reset -q --hard")


@pytest.mark.parametrize("where", ["loose", "packed"])
def test_a_replace_ref_does_not_hide_what_git_push_sends(who: Identity, lab: Lab, where: str
                                                         ) -> None:
    script = REPLACE + (" && git pack-refs --all" if where == "packed" else "")
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        stderr = _plant(who, lab, sandbox, script)
        shown = _host_git(who, project, "show", "HEAD:f").stdout
        # Control: after the naive sandbox the user reviews GOOD; EVIL is what is pushed.
        assert shown == ("GOOD\n" if sandbox == "naive" else "EVIL\n"), (sandbox, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "replace ref" in stderr, stderr
            # The agent's own commit and branch stay, packed or not.
            log = _host_git(who, project, "log", "--format=%s", "main")
            assert log.stdout.split() == ["change", "base"], log


def test_grafts_do_not_rewrite_the_history_the_user_reviews(who: Identity, lab: Lab) -> None:
    """``info/grafts`` (read-only when ``info/`` exists at launch; made here where it did
    not) gives a commit other parents: ``git log`` shows another history than is pushed."""
    script = (f"mkdir -p .git/info && git {ID} commit -q --allow-empty -m two && "
              "git rev-parse HEAD > .git/info/grafts")
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        shutil.rmtree(project / ".git" / "info")
        stderr = _plant(who, lab, sandbox, script)
        count = _host_git(who, project, "rev-list", "--count", "HEAD").stdout.strip()
        # Control: after the naive sandbox, the grafted commit has no parent.
        assert count == ("1" if sandbox == "naive" else "2"), (sandbox, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "grafts" in stderr, stderr


def test_alternates_do_not_bring_in_another_store(who: Identity, lab: Lab) -> None:
    """The agent names another repository's objects (a path the sandbox never showed) and
    a ref to its commit: host git would read, show and push that commit from the project."""
    other = lab.home / "dev" / f"other-{uuid.uuid4().hex[:8]}"
    other.mkdir()
    git(other, "init", "-q")
    (other / "secret").write_text("private\n")
    git(other, "add", "secret")
    git(other, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qm", "s")
    sha = subprocess.run(["git", "-C", str(other), "rev-parse", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    lab.own(other)
    script = (f"echo {other}/.git/objects > .git/objects/info/alternates && "
              f"echo {sha} > .git/refs/heads/theirs")
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        stderr = _plant(who, lab, sandbox, script)
        seen = _host_git(who, project, "cat-file", "-e", f"{sha}:secret")
        # Control: after the naive sandbox, host git reads the other repository's commit.
        assert (seen.returncode == 0) == (sandbox == "naive"), (sandbox, seen, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "store it names" in stderr, stderr
