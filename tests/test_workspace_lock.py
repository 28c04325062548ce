"""A tree one sandbox writes is written by no other sandbox while that run lives.

Review 4: run B plants a git hook in W; run C starts in W while B lives, and its launch
census backs the plant up; B's audit quarantines it; C's payload touches the hook, and
C's audit "puts back the copy taken at launch", which is B's plant.  Host git then ran
it.  Review 5 did the same with nested workspaces (W and W/sub), with an agent and a
``--workspace`` run in its project, and, as a plain user, by making W unreadable so that
the next run's lock could not be taken and it ran unheld.  Now a run holds its trees
(flock: exclusive on each, shared on every folder above) from its census to its audit,
another run on the same, a folder above or one below refuses, and one that cannot take
the lock refuses too (corral.workspace.held).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_lab import Lab
from conftest import Identity

pytestmark = pytest.mark.sandbox


def test_a_reused_workspace_takes_one_run_at_a_time(who: Identity) -> None:
    ws = who.chown(_made(who.tmp / "ws"))
    first = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--workspace", str(ws),
                              "--", "/bin/sh", "-c", ": > /work/started; sleep 30"],
                             env=who.environ(), cwd=who.tmp, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = who.corral("run", "--workspace", str(ws), "--", "/bin/true")
        assert second.returncode == 125, second
        assert "is in use by another corral run" in second.stderr, second.stderr
    finally:
        first.kill()
        first.communicate()
    # Control: once the first run is over, the workspace takes the next one.
    deadline = time.monotonic() + 60
    while (after := who.corral("run", "--workspace", str(ws), "--", "/bin/true")).returncode:
        assert time.monotonic() < deadline, after  # the killed launcher's sandbox ending
        time.sleep(0.5)


def _made(path: Path) -> Path:
    path.mkdir()
    return path


@contextlib.contextmanager
def _running(who: Identity, marker: Path, *args: str, cwd: Path | None = None
             ) -> Iterator[subprocess.Popen[str]]:
    """``corral ARGS`` started as ``who``, once it has made ``marker``; killed at the end."""
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", *args], env=who.environ(),
                            cwd=cwd or who.tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.communicate()


def _eventually(who: Identity, *args: str, cwd: Path | None = None) -> None:
    """The control: once the holding run is over, the same command runs."""
    deadline = time.monotonic() + 60
    while (after := who.corral(*args, cwd=cwd)).returncode:
        assert time.monotonic() < deadline, after  # the killed launcher's sandbox ending
        time.sleep(0.5)


def test_nested_workspaces_take_one_run_at_a_time(who: Identity) -> None:
    top = who.chown(_made(who.tmp / "top"))
    sub = who.chown(_made(top / "sub"))
    other = who.chown(_made(who.tmp / "other"))
    hold = ("--", "/bin/sh", "-c", ": > /work/started; sleep 30")
    for held, refused in ((top, sub), (sub, top)):
        with _running(who, held / "started", "run", "--workspace", str(held), *hold):
            r = who.corral("run", "--workspace", str(refused), "--", "/bin/true")
            assert r.returncode == 125 and "in use by another corral run" in r.stderr, r
            # A folder beside it is no one's: it runs meanwhile.
            beside = who.corral("run", "--workspace", str(other), "--", "/bin/true")
            assert beside.returncode == 0, beside
        (held / "started").unlink()
        _eventually(who, "run", "--workspace", str(refused), "--", "/bin/true")


def test_an_agent_and_a_run_never_share_a_project(who: Identity, lab: Lab) -> None:
    as_owner = ["--user", f"{lab.uid}:{lab.gid}"] if os.geteuid() == 0 else []
    run = ["run", *as_owner, "--workspace", str(lab.project), "--"]
    with _running(who, lab.project / "started", "agent", "--", "/bin/sh", "-c",
                  ": > started; sleep 30", cwd=lab.project):
        r = who.corral(*run, "/bin/true")
        assert r.returncode == 125 and "in use by another corral run" in r.stderr, r
    (lab.project / "started").unlink()
    _eventually(who, *run, "/bin/true")
    with _running(who, lab.project / "started", *run, "/bin/sh", "-c",
                  ": > /work/started; sleep 30"):
        r = who.corral("agent", "--", "/bin/true", cwd=lab.project)
        assert r.returncode == 125 and "in use by another corral run" in r.stderr, r
    (lab.project / "started").unlink()
    _eventually(who, "agent", "--", "/bin/true", cwd=lab.project)


def test_a_workspace_its_payload_made_unreadable_is_never_run_unheld(who: Identity) -> None:
    """The review's payload kept its workspace at mode 0300 (write and search, no read)
    whenever the next launch tried its lock, and gave the read back for that run's census;
    here the folder is left so, as the launch finds it."""
    ws = who.chown(_made(who.tmp / "ws"))
    os.chmod(ws, 0o300)
    after = who.corral("run", "--workspace", str(ws), "--", "/bin/true")
    if who.uid == 0:  # root reads it whatever its mode: the lock is taken
        assert after.returncode == 0, after
    else:
        assert after.returncode == 125 and "cannot lock" in after.stderr, after
        assert after.stderr.count("\n") == 1, after.stderr
    # Control: the folder readable again, the run goes on.
    os.chmod(ws, 0o755)
    assert who.corral("run", "--workspace", str(ws), "--", "/bin/true").returncode == 0


def test_a_link_through_another_runs_tree_is_refused_wherever_it_points(who: Identity
                                                                        ) -> None:
    """Review 6: a payload repointed ``T/link`` while the user's next run resolved
    ``--workspace T/link`` twice: the lock held one folder (outside T), the run used the
    other (inside T, the payload's own tree).  Now the run uses the folder as locked, and
    every folder on the way, as given, is held too: a path through a tree another run
    writes is refused wherever its link points at the moment.  Control: once that run
    is over, the same path runs."""
    tree = who.chown(_made(who.tmp / "T"))
    out = who.chown(_made(who.tmp / "out"))
    (tree / "link").symlink_to(out)
    with _running(who, tree / "started", "run", "--workspace", str(tree), "--",
                  "/bin/sh", "-c", ": > /work/started; sleep 30"):
        r = who.corral("run", "--workspace", str(tree / "link"), "--", "/bin/true")
        assert r.returncode == 125 and "in use by another corral run" in r.stderr, r
        assert "on the way" in r.stderr, r.stderr
    (tree / "started").unlink()
    _eventually(who, "run", "--workspace", str(tree / "link"), "--", "/bin/true")


def test_a_folder_of_ones_own_on_the_way_that_cannot_be_read_is_refused(who: Identity
                                                                         ) -> None:
    """Review 6: an agent's payload made its own project unreadable (0311) whenever the
    next launch locked a workspace inside it, and the lock passed over a folder it could
    not read.  Now a folder on the way that is the user's own must be held; root reads
    it whatever its mode.  Control: readable again, the run goes on."""
    above = who.chown(_made(who.tmp / "P"))
    ws = who.chown(_made(above / "ws"))
    os.chmod(above, 0o311)
    try:
        r = who.corral("run", "--workspace", str(ws), "--", "/bin/true")
        if who.uid == 0:
            assert r.returncode == 0, r
        else:
            assert r.returncode == 125 and "cannot lock" in r.stderr, r
            assert str(above) in r.stderr and r.stderr.count("\n") == 1, r.stderr
    finally:
        os.chmod(above, 0o755)
    assert who.corral("run", "--workspace", str(ws), "--", "/bin/true").returncode == 0


def test_an_input_in_another_runs_tree_is_refused(who: Identity) -> None:
    """Review 7: while an agent ran in P, a ``corral run --input P/d`` started, and the
    agent's payload, woken by the copy's first open, swapped ``P/d`` for a link to /etc:
    the root launcher copied /etc in, and its payload read /etc/shadow.  Now what a run
    reads by path is held too (every folder on the way, and the folder itself), and the
    copy reads by descriptor, never through a link beneath what was given.  Control: once
    the run writing T is over, the same input is copied in."""
    tree = who.chown(_made(who.tmp / "T"))
    (tree / "d").mkdir()
    (tree / "d" / "f").write_text("input\n")
    who.chown(tree)
    read = ("run", "--input", str(tree / "d"), "--", "/bin/cat", "/work/d/f")
    with _running(who, tree / "started", "run", "--workspace", str(tree), "--",
                  "/bin/sh", "-c", ": > /work/started; sleep 30"):
        r = who.corral(*read)
        assert r.returncode == 125, r
        assert "which another corral run's sandbox writes" in r.stderr, r.stderr
        ro = who.corral("run", "--ro", str(tree / "d"), "--", "/bin/true")
        assert ro.returncode == 125 and "sandbox writes" in ro.stderr, ro
    (tree / "started").unlink()
    _eventually(who, *read)
    assert who.corral(*read).stdout == "input\n"


def test_a_runs_directory_inside_the_workspace_is_refused(who: Identity) -> None:
    """The launcher writes the record and moves quarantined files into the runs directory
    by path: inside the tree the sandbox writes, the payload swapped a link in for its
    run's folder and sent both out of the project (found while closing review 7).
    Control: beside the workspace, the same run goes on."""
    ws = who.chown(_made(who.tmp / "ws"))
    r = who.corral("run", "--workspace", str(ws), "--runs-dir", str(ws / "runs"), "--",
                   "/bin/true")
    assert r.returncode == 125 and "the runs directory" in r.stderr, r
    assert not (ws / "runs").exists()
    ok = who.corral("run", "--workspace", str(ws), "--runs-dir", str(who.tmp / "runs-beside"),
                    "--", "/bin/true")
    assert ok.returncode == 0, ok


def _secret(who: Identity) -> tuple[Path, str]:
    """A folder of the identity's own that no sandbox of its sees, with a file inside."""
    secret = who.chown(_made(who.tmp / "private"))
    words = f"SECRET-{os.urandom(6).hex()}"
    (secret / "config").write_text(words + "\n")
    who.chown(secret / "config")
    (secret / "config").chmod(0o600)
    secret.chmod(0o700)
    return secret, words


def test_a_chain_of_links_through_another_runs_tree_is_refused(who: Identity) -> None:
    """Review 8: ``L -> T/out``, and T's live payload made ``T/out -> private``.  The lock
    held the folders of ``realpath(L)`` only, not T, whose link the chain went through, so
    a root launch copied the private file in for its payload (uid 65534) to read.  Now every
    folder a name is looked up in on the way is held.  Control: once T's run is over, the
    same input is copied (a path the user chose, with no sandbox live in it)."""
    tree = who.chown(_made(who.tmp / "T"))
    secret, words = _secret(who)
    link = who.tmp / "L"
    link.symlink_to(tree / "out")
    read = ("run", "--input", f"{link}/config", "--", "/bin/cat", "/work/config")
    with _running(who, tree / "started", "run", "--workspace", str(tree), "--", "/bin/sh",
                  "-c", f"ln -s {secret} /work/out; : > /work/started; sleep 30"):
        r = who.corral(*read)
        assert r.returncode == 125 and words not in r.stdout, r
        assert f"is read through {tree}, which another corral run's sandbox writes" \
            in r.stderr, r.stderr
    (tree / "started").unlink()
    _eventually(who, *read)
    assert who.corral(*read).stdout == words + "\n"


def test_an_input_through_another_runs_fresh_workspace_is_refused(who: Identity) -> None:
    """Review 8: a fresh workspace (``RUNS/<id>/work``) was held by no lock, so an input by
    a path through it followed whatever link its live payload made there.  Now a run holds
    its own folder while it lives.  Control: once that run is over, the same input is
    copied.  (The profile has no disk limit: with one, root's fresh workspace is an image
    the host does not see into while the run lives.)"""
    profile = who.tmp / "nodisk.toml"
    profile.write_text('description = "no disk limit"\n[limits]\ntimeout = "5m"\n')
    secret, words = _secret(who)
    runs = who.tmp / "runs"
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--profile", str(profile),
                             "--", "/bin/sh", "-c", f"ln -s {secret} /work/out; "
                             ": > /work/started; sleep 30"], env=who.environ(), cwd=who.tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (started := list(runs.glob("*/work/started"))):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        work = started[0].parent
        read = ("run", "--input", f"{work}/out/config", "--", "/bin/cat", "/work/config")
        r = who.corral(*read)
        assert r.returncode == 125 and words not in r.stdout, r
        assert "which another corral run's sandbox writes" in r.stderr, r.stderr
    finally:
        proc.kill()
        proc.communicate()
    _eventually(who, *read)
    assert who.corral(*read).stdout == words + "\n"


def test_a_link_swapped_in_after_the_path_was_settled_fails_the_copy(tmp_path: Path) -> None:
    """What no lock keeps out (a writer of corral's copies of an agent's state) can still
    swap a link in between the resolution under the locks and the copy: the copy opens the
    folder as resolved, from / with no link followed, so it fails and reads nothing.
    Control: left alone, the same settled path is copied."""
    from corral import fsops, workspace
    from corral.errors import UsageError

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "config").write_text("mine\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config").write_text("SECRET\n")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "out").mkdir()
    src = workspace.settled(str(tmp_path / "via" / "config"))
    assert src == str(tmp_path / "real" / "config")
    with fsops.Tree(str(tmp_path / "out")) as tree:
        workspace.copy_in(tree, src)  # control
        assert (tmp_path / "out" / "config").read_text() == "mine\n"
        (tmp_path / "out" / "config").unlink()
        (tmp_path / "real").rename(tmp_path / "real.old")
        (tmp_path / "real").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(UsageError, match="changed while it was copied"):
            workspace.copy_in(tree, src)
    assert not (tmp_path / "out" / "config").exists()


def test_a_path_through_proc_is_refused(who: Identity) -> None:
    """/proc's links (``/proc/PID/root``, ``/proc/PID/cwd``) lead into another process's
    view, which the walk of their text cannot hold (review 9's lead: a path into a live
    sandbox's mount namespace would go unseen).  Control: the same file by its own path."""
    r = who.corral("run", "--input", "/proc/self/root/etc/hostname", "--", "/bin/true")
    assert r.returncode == 125 and "goes through /proc" in r.stderr, r
    ok = who.corral("run", "--input", "/etc/hostname", "--", "/bin/cat", "/work/hostname")
    assert ok.returncode == 0 and ok.stdout == Path("/etc/hostname").read_text(), ok


READ_ONLY_SWAP = """
import os, sys
from corral import agent, api, bwrap, resolve
from corral.bwrap import BindFd, RoBind
from corral.policy import Policy
from corral.profiles import load_profile
from corral.record import replace
mode, how, home, project = sys.argv[1:5]
shown, real = home + "/notes", home + "/notes.d"

def then_swap(fn):
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        os.rename(real, real + ".old")  # what another writer does once the launch resolved
        os.symlink(home + "/private", real)
        return out
    return wrapped

def by_path(o):  # as before: read-only by path, a writable file opened following links
    if not (isinstance(o, BindFd) and o.handle.no_links):
        return o
    if o.writable:
        return o._replace(handle=o.handle._replace(no_links=False))
    return RoBind(o.handle.path, o.dest)

if how == "control":  # the protection removed
    built = bwrap.build_ops
    bwrap.build_ops = lambda *a, **k: [by_path(o) for o in built(*a, **k)]
cmd = ["/bin/cat", shown + "/diary.txt"]
try:
    if mode == "run":
        resolve.resolve_run = then_swap(resolve.resolve_run)
        r = api.run(cmd, Policy(read_only=(shown,)))
    else:
        agent.resolve_agent = then_swap(agent.resolve_agent)
        policy = load_profile("generic")
        if mode == "agent":
            policy = replace(policy, read_only=(*policy.read_only, shown))
        else:  # a writable file, its folder named through the user's link
            policy = replace(policy, writable=(*policy.writable, shown + "/diary.txt"))
        r = api.run_agent(cmd, policy, project=project, capture=True, record=False)
    print("RAN", r.status, r.exit_code, r.stdout, r.stderr)
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.mark.parametrize("mode", ["run", "agent", "agent-rw-file"])
def test_a_link_swapped_in_on_the_way_to_a_read_only_path_fails_the_launch(
        who: Identity, lab: Lab, mode: str) -> None:
    """A ``--ro`` path was bound by path, a ``--rw`` file opened by path: a link another
    writer swapped in on the way between the resolution and the launch chose what the
    sandbox saw (here the user's private folder in place of their notes).  Each is now
    opened, as resolved, from / without following a link, and bound by that descriptor:
    the swap fails the launch.  Control: the same swap, the path opened following links,
    shows the private file."""
    home = lab.home
    (home / "notes.d").mkdir()
    (home / "notes.d" / "diary.txt").write_text("mine\n")
    (home / "notes").symlink_to(home / "notes.d")  # a link the user made: still followed
    (home / "private").mkdir()
    (home / "private" / "diary.txt").write_text(lab.token + "\n")
    lab.own(home / "notes.d", home / "notes", home / "private")

    def attempt(how: str) -> str:
        if (home / "notes.d.old").exists():  # undo the last swap
            (home / "notes.d").unlink()
            (home / "notes.d.old").rename(home / "notes.d")
        out = who.run([who.prefix()[-1], "-c", READ_ONLY_SWAP, mode, how, str(home),
                       str(lab.project)], cwd=lab.project, timeout=300)
        return out.stdout + out.stderr

    try:
        got = attempt("protected")
        assert "REFUSED LaunchError" in got and "notes.d" in got, got  # became a link
        assert lab.token not in got
        ctl = attempt("control")
        assert "RAN" in ctl and lab.token in ctl, ctl
    finally:
        for p in ("notes", "notes.d", "notes.d.old", "private"):
            q = home / p
            if q.is_symlink() or q.is_file():
                q.unlink()
            elif q.is_dir():
                shutil.rmtree(q)


HELD_SWAP = """
import os, sys
from corral import api, fsops
from corral.policy import Policy
how, parent, victim = sys.argv[1:4]
real_check = api._check_owners_way

def then_swap(*args, **kwargs):  # right after the lock: the folder above, swapped
    real_check(*args, **kwargs)
    os.rename(parent, parent + ".moved")
    os.symlink(victim, parent)

api._check_owners_way = then_swap
if how == "control":  # the protection removed: the held tree reached by name again
    fsops.open_held = lambda path, flags: None
try:
    r = api.run(["/bin/sh", "-c", "id -u; ls /work; cat /work/notes.txt 2>&1; true"],
                Policy(), workspace_dir=parent + "/src")
    print("RAN", r.status, r.stdout.decode())
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def test_root_reaches_a_held_workspace_through_its_lock_not_its_name(root: Identity,
                                                                    lab: Lab) -> None:
    """Review 42: started by root for a user's project, the user swapped the folder above
    the locked workspace for a link to a third user's home; the owner's stat, the bind and
    the audit then went by name, and the payload ran as that third user with their folder
    as /work.  A held tree is now reached through the descriptor that holds it.  Control:
    reached by name again, the same swap gives the third user's uid and file."""
    parent = lab.home / "rev42"
    (parent / "src").mkdir(parents=True)
    (parent / "src" / "main.c").write_text("mine\n")
    lab.own(parent)
    victim = root.tmp / "victim"
    (victim / "src").mkdir(parents=True)
    (victim / "src" / "notes.txt").write_text(lab.token + "\n")
    for p in (victim, victim / "src", victim / "src" / "notes.txt"):
        os.chown(p, 65534, 65534)
    victim.chmod(0o700)

    def attempt(how: str) -> str:
        moved = parent.with_name("rev42.moved")
        if moved.exists():  # undo the last swap
            parent.unlink()
            moved.rename(parent)
        out = root.run([sys.executable, "-c", HELD_SWAP, how, str(parent), str(victim)],
                       timeout=300)
        return out.stdout + out.stderr

    try:
        got = attempt("protected")
        assert got.split()[:3] == ["RAN", "exited", str(lab.uid)], got  # the owner's uid
        assert "main.c" in got and lab.token not in got, got
        ctl = attempt("control")
        assert ctl.split()[:3] == ["RAN", "exited", "65534"] and lab.token in ctl, ctl
    finally:
        if parent.is_symlink():
            parent.unlink()
        shutil.rmtree(parent.with_name("rev42.moved"), ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)


RUNS_SWAP = """
import os, sys
from corral import api, resolve, workspace
from corral.policy import Policy
how, runs, target = sys.argv[1:4]
real = resolve.resolve_run

def then_swap(*args, **kwargs):  # the run's folder is made: swapped for a link
    out = real(*args, **kwargs)
    [run_id] = [n for n in os.listdir(runs) if not n.startswith(".")]
    os.rename(os.path.join(runs, run_id), os.path.join(runs, "moved"))
    os.symlink(target, os.path.join(runs, run_id))
    return out

resolve.resolve_run = then_swap
if how == "control":  # the protection removed: any runs directory is taken
    workspace.check_runs_dir = lambda runs_dir: None
try:
    r = api.run(["/bin/true"], Policy(), runs_dir=runs)
    print("RAN", r.status)
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def test_a_runs_directory_someone_else_can_change_is_refused(who: Identity, lab: Lab
                                                             ) -> None:
    """Review 42: corral writes the run's record, the audit's quarantine and a fresh
    workspace in ``RUNS/<id>`` by name; in a runs directory another user could write,
    that user swapped ``RUNS/<id>`` for a link and root wrote its record where the link
    led.  Such a runs directory is refused: another user's (root's run), one others may
    write without the sticky bit (a plain user's), or one named through another user's
    link in a sticky folder (review 43: its owner repointed it during the run).  Control:
    taken anyway, the same swap puts the record in the attacker's folder."""
    runs = who.tmp / "others-runs"
    runs.mkdir()
    if who.is_root:
        os.chown(runs, lab.uid, lab.gid)
    else:  # root's, and world-writable without the sticky bit
        runs.chmod(0o777)
    target = who.tmp / "attackers"
    target.mkdir(mode=0o777)
    target.chmod(0o777)
    try:
        got = who.run([who.prefix()[-1], "-c", RUNS_SWAP, "protected", str(runs),
                       str(target)], timeout=300)
        assert "REFUSED UsageError" in got.stdout and "runs directory" in got.stdout, got
        assert not (target / "record.json").exists()
        if who.is_root:  # another user's link to a runs directory of root's own
            (who.tmp / "sticky").mkdir(mode=0o1777)
            (who.tmp / "sticky").chmod(0o1777)
            (who.tmp / "own-runs").mkdir(mode=0o700)
            (who.tmp / "sticky" / "runs").symlink_to(who.tmp / "own-runs")
            os.lchown(who.tmp / "sticky" / "runs", lab.uid, lab.gid)
            r = who.corral("run", "--runs-dir", str(who.tmp / "sticky" / "runs"), "--",
                           "/bin/true")
            assert r.returncode == 125 and "through the link" in r.stderr, r
        ctl = who.run([who.prefix()[-1], "-c", RUNS_SWAP, "control", str(runs), str(target)],
                      timeout=300)
        assert "RAN exited" in ctl.stdout and (target / "record.json").exists(), ctl
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def test_root_never_takes_an_owner_through_a_third_users_link(root: Identity, lab: Lab
                                                              ) -> None:
    """Started by root with ``--workspace`` and no ``--user``, the payload runs as the
    folder's owner: a user's link on the way (``~/rev42 -> another user's home``) chose
    whose folder, and so whose uid, the payload got (review 42).  Every folder on the way
    must be the owner's or root's: refused.  Control: without that check, the payload
    runs as the third user and reads their file."""
    victim = root.tmp / "victim"
    (victim / "src").mkdir(parents=True)
    (victim / "src" / "notes.txt").write_text(lab.token + "\n")
    for p in (victim, victim / "src", victim / "src" / "notes.txt"):
        os.chown(p, 65534, 65534)
    link = lab.home / "rev42-link"
    link.symlink_to(victim)
    os.lchown(link, lab.uid, lab.gid)
    cmd = ["run", "--workspace", f"{link}/src", "--", "/bin/sh", "-c",
           "id -u; cat /work/notes.txt"]
    # Review 43: the user's link alone, in a sticky folder of root's (as in /tmp), where
    # its owner may repoint it at any time; every folder on the way is root's or the
    # victim's.  The link's own owner is checked too.
    sticky = root.tmp / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "proj").symlink_to(victim / "src")
    os.lchown(sticky / "proj", lab.uid, lab.gid)
    try:
        r = root.corral(*cmd)
        assert r.returncode == 125 and "reached through" in r.stderr, r
        assert lab.token not in r.stdout
        r = root.corral("run", "--workspace", str(sticky / "proj"), "--", "/bin/sh", "-c",
                        "id -u; cat /work/notes.txt")
        assert r.returncode == 125 and "reached through the link" in r.stderr, r
        assert lab.token not in r.stdout
        ctl = root.run([sys.executable, "-c", "import sys\nfrom corral import cli, workspace\n"
                        "workspace.check_way = lambda *a: None\ncli.main(sys.argv[1:])",
                        *cmd], timeout=300)
        assert ctl.stdout.split()[:2] == ["65534", lab.token], ctl
    finally:
        link.unlink()


def test_a_group_writable_folder_of_ones_own_group_is_not_another_writer(
        root: Identity, lab: Lab) -> None:
    """Debian's and Ubuntu's usergroups umask (002) leaves home folders such as ~/.local
    group-writable for the owner's own group, which no one else is in: the runs
    directory's check takes that for what it is.  Control: the same folder in a group
    another user is in is refused."""
    import grp

    from corral import workspace
    from corral.errors import UsageError

    folder = root.tmp / "upg"
    folder.mkdir()
    os.chown(folder, lab.uid, lab.gid)  # the test user's own group (useradd made it)
    folder.chmod(0o775)
    assert grp.getgrgid(lab.gid).gr_mem in ([], [pwd.getpwuid(lab.uid).pw_name])
    workspace.check_way(str(folder / "runs"), lab.uid, "runs", "why", "fix")
    name = f"crl-{os.urandom(4).hex()}"  # one of its own: test sessions run side by side
    subprocess.run(["groupadd", "-f", name], check=True)
    try:
        subprocess.run(["gpasswd", "-a", "nobody", name], check=True, capture_output=True)
        os.chown(folder, lab.uid, grp.getgrnam(name).gr_gid)
        with pytest.raises(UsageError, match="others may write"):
            workspace.check_way(str(folder / "runs"), lab.uid, "runs", "why", "fix")
    finally:
        subprocess.run(["groupdel", name], check=False)
