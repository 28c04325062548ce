"""corral.gitstate, with git itself as the oracle: for each variant of a state file, host
git 2.39 resumes the operation (as root and as the test user) and either runs the planted
marker or not; whatever git runs, :func:`gitstate.commands` must have named.  The variants
are the forms git's parsers accept and the near misses they refuse; a variant git refuses
may still be named (failing closed costs the user a quarantine, never a command).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from conftest import Identity
from corral import fsops, gitstate

ENV = ("export GIT_CONFIG_COUNT=3 GIT_CONFIG_KEY_0=user.name GIT_CONFIG_VALUE_0=u "
       "GIT_CONFIG_KEY_1=user.email GIT_CONFIG_VALUE_1=u@example.invalid "
       "GIT_CONFIG_KEY_2=core.editor GIT_CONFIG_VALUE_2=true; ")
HISTORY = ("git init -q -b main . && echo 1 > f && git add f && git commit -qm a && "
           "echo 2 > f && git commit -qam b && echo 3 > g && git add g && git commit -qm c && ")
REBASE = HISTORY + ("GIT_SEQUENCE_EDITOR=\"sed -i -e '1i break' -e '/ b$/d'\" "
                    "git rebase -q -i HEAD~2; ")
EVIL = ("mkdir -p git-merge-x && printf '#!/bin/sh\\ntouch MARK\\nexit 2\\n' > evil && "
        "chmod 755 evil; ")
AM = HISTORY + ("git format-patch -q -2 -o p && git reset -q --hard HEAD~2 && echo 9 > f && "
                "git commit -qam m; git am p/* >/dev/null 2>&1; ")

TODO = ["exec touch MARK", "x touch MARK", " \tx touch MARK", "exec\ttouch MARK",
        "exec touch MARK\r", "  exec   touch MARK", "X touch MARK", "# exec touch MARK",
        "execute touch MARK", "\vexec touch MARK", "x\vtouch MARK", "break\nexec touch MARK"]
STRATEGY = ["x/../evil", "x/../evil\n", "ort", "ort\n", "ort\r\n", " ort", "ours\n",
            "x/../evil\r\n", "resolve\n\n", "\n"]
APPLY = ["'--build-fake-ancestor=MARK'", " '--build-fake-ancestor=MARK' ",
         "'--build=MARK'", "'--whitespace=nowarn' '--build-fake-ancestor=MARK'",
         "'--build-fake-ancestor'\\''=MARK'", "'--build-fake-ancestor=MA'\\''RK'",
         "'--whitespace=nowarn'", "'-C1' '-p1'", "--build-fake-ancestor=MARK",
         "'--build-fake-ancestor=MARK''--x'", "'--directory=sub'"]


PICK = (HISTORY + "git checkout -q -b side && git reset -q --hard HEAD~2 && echo 9 > f && "
        "git commit -qam m; git cherry-pick side~1 side >/dev/null 2>&1; "
        "git checkout -q --theirs f && git add f; " + EVIL)
OPTS = ["[options]\n\tstrategy = x/../evil\n", "[OPTIONS]\nStrategy=\"x/../evil\"\n",
        "[options] strategy = x/../evil", "[options]\n\tstrategy = ort\n",
        "[options]\n\tstrategy = ort\n\tstrategy = x/../evil\n",
        "[options]\n\tstrategy = x/../e\\\nvil\n", "[options]\n\tedit = false\n"]
# kind: (what stops the operation, how the text is written, the variants, the resumption)
KINDS = {
    "todo": (REBASE, ">> .git/rebase-merge/git-rebase-todo", [t + "\n" for t in TODO],
             "rebase --continue"),
    "strategy": (REBASE + EVIL, "> .git/rebase-merge/strategy", STRATEGY, "rebase --continue"),
    "apply": (AM, "> .git/rebase-apply/apply-opt", APPLY, "am --skip"),
    "opts": (PICK, "> .git/sequencer/opts", OPTS, "cherry-pick --continue"),
}


def _case(who: Identity, plant: str, write: str, text: str, resume: str
          ) -> tuple[str, bool, bool]:
    """(text, named by gitstate, run by git) for one planted text."""
    repo = who.tmp / f"r-{uuid.uuid4().hex[:8]}"
    made = who.run(["sh", "-c", f"mkdir {repo} && cd {repo} && {ENV}{plant}"
                    f"cat ../text {write} && echo PLANTED"])
    assert "PLANTED" in made.stdout, made
    with fsops.Tree(str(repo)) as tree:
        named = bool(gitstate.commands(tree, ".git"))
    who.run(["sh", "-c", f"{ENV}git {resume}"], cwd=repo)
    return text, named, (repo / "MARK").exists()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_what_git_runs_is_what_gitstate_names(who: Identity, kind: str) -> None:
    plant, write, texts, resume = KINDS[kind]
    cases = []
    for text in texts:
        (who.tmp / "text").write_text(text)
        if os.geteuid() == 0:
            os.chown(who.tmp / "text", who.uid, who.gid)
        cases.append(_case(who, plant, write, text, resume))
    missed = [text for text, named, ran in cases if ran and not named]
    assert not missed, f"git ran these and gitstate did not name them: {missed}"
    assert any(ran for _, _, ran in cases), f"no variant ran: the oracle tested nothing {cases}"
    assert any(not named for _, named, _ in cases), f"gitstate named every variant {cases}"


def test_a_state_folder_that_is_a_link_or_unreadable_counts(tmp_path: Path) -> None:
    """git follows a link at .git/rebase-merge; corral does not read through one, so it
    names the link instead of guessing what lies behind it."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".git" / "rebase-merge").symlink_to("../elsewhere")
    (tmp_path / ".git" / "sequencer").mkdir()
    (tmp_path / ".git" / "sequencer" / "opts").symlink_to("../../elsewhere/x")
    with fsops.Tree(str(tmp_path)) as tree:
        found = gitstate.commands(tree, ".git")
    assert set(found) == {".git/rebase-merge", ".git/sequencer"}, found
    # Control: a plain folder with only data in it is not named.
    for p in (tmp_path / ".git" / "rebase-merge", tmp_path / ".git" / "sequencer" / "opts"):
        p.unlink()
    (tmp_path / ".git" / "rebase-merge").mkdir()
    (tmp_path / ".git" / "rebase-merge" / "git-rebase-todo").write_text("pick 1234 a\n")
    with fsops.Tree(str(tmp_path)) as tree:
        assert gitstate.commands(tree, ".git") == {}
