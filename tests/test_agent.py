"""``corral agent`` and ``corral shell``: the seed's lab, reproduced and contained.

The lab: a home with ~/.fake-creds/token (FAKE-TOKEN), ~/.ssh/id_ed25519,
~/.aws/credentials and an unlisted ~/.config/sometool/secret; a project in
~/dev/demo-* with a git repository and a git-ignored nested one.  Each
protection runs beside its negative control: the seed's naive bwrap sandbox
(``--ro-bind / / --bind "$PWD" "$PWD"``) doing the same thing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from agent_lab import Lab, agent, naive
from conftest import IS_ROOT, Identity
from egress_util import Origin

pytestmark = pytest.mark.sandbox


def _runs_as(who: Identity, lab: Lab) -> None:
    if who.is_root:
        return
    if IS_ROOT:  # the user variant must be the project's owner to write it
        assert who.uid == lab.uid


READ_SECRETS = "cat $H/.fake-creds/token $H/.ssh/id_ed25519 $H/.aws/credentials " \
               "$H/.config/sometool/secret .env 2>/dev/null; echo"


def test_secrets_in_home_and_project_are_unreadable(who: Identity, lab: Lab) -> None:
    _runs_as(who, lab)
    script = READ_SECRETS.replace("$H", str(lab.home))
    r = agent(who, lab, script)
    assert r.returncode == 0, r.stderr
    assert lab.token not in r.stdout
    ctl = naive(who, lab, script)
    assert lab.token in ctl.stdout  # the seed's failure: the fake token is read


def test_project_is_writable_and_home_is_not(who: Identity, lab: Lab) -> None:
    _runs_as(who, lab)
    script = "echo new > made.txt && echo more >> README.md && cat made.txt README.md; " \
             "(echo pwn >> ~/.bashrc) 2>/dev/null && echo WROTE-BASHRC; id -u"
    r = agent(who, lab, script)
    assert r.returncode == 0, r.stderr
    assert "WROTE-BASHRC" not in r.stdout and "new\ndemo\nmore\n" in r.stdout
    assert (lab.project / "made.txt").stat().st_uid == lab.uid
    assert int(r.stdout.split()[-1]) == lab.uid
    assert (lab.home / ".bashrc").read_text() == "# rc\n"
    # The seed's other failure: launched from ~, the naive sandbox makes ~/.bashrc writable.
    ctl = naive(who, lab, f"echo pwn >> {lab.home}/.bashrc && echo WROTE-BASHRC", cwd=lab.home)
    assert "WROTE-BASHRC" in ctl.stdout
    (lab.home / ".bashrc").write_text("# rc\n")


def test_git_hooks_config_and_nested_repos_are_read_only(who: Identity, lab: Lab) -> None:
    _runs_as(who, lab)
    attempts = [".git/hooks/pre-commit", ".git/config", "nested/.git/hooks/pre-commit",
                "nested/.git/config"]
    script = "; ".join(f"(echo '#!/bin/sh' >> {a}) 2>/dev/null && echo WROTE {a}"
                       for a in attempts)
    script += "; (mv .git .git-old) 2>/dev/null && echo RENAMED; " \
              "git add README.md && git -c user.name=a -c user.email=a@b commit -qm x " \
              "&& echo COMMITTED"
    r = agent(who, lab, script)
    assert "WROTE" not in r.stdout and "RENAMED" not in r.stdout, r.stdout
    assert "COMMITTED" in r.stdout, r.stdout + r.stderr  # everyday git still works
    assert not (lab.project / ".git/hooks/pre-commit").exists()
    assert (lab.project / ".git").is_dir() and not (lab.project / ".git-old").exists()
    ctl = naive(who, lab, script.replace("; git add", "; true || git add"))
    for a in attempts:
        assert f"WROTE {a}" in ctl.stdout
    assert "RENAMED" in ctl.stdout


def test_protected_names_stay_read_only_at_any_depth(who: Identity, lab: Lab) -> None:
    names = [".vscode/tasks.json", "sub/deep/.idea/workspace.xml", ".claude/settings.json",
             ".gitmodules", "sub/.bashrc", ".mcp.json"]
    for n in names:
        (lab.project / n).parent.mkdir(parents=True, exist_ok=True)
        (lab.project / n).write_text("orig\n")
    lab.own(lab.project)
    script = "; ".join(f"(echo pwn >> {n}) 2>/dev/null && echo WROTE {n}" for n in names)
    script += "; true"
    r = agent(who, lab, script)
    assert r.returncode == 0 and "WROTE" not in r.stdout, r.stdout
    for n in names:
        assert (lab.project / n).read_text() == "orig\n"
    ctl = naive(who, lab, script)
    assert all(f"WROTE {n}" in ctl.stdout for n in names)


def _host_hg(who: Identity, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """hg on the host, as the identity under test (root trusts the user's hgrc, as a root
    who set ``trusted.users = *`` would)."""
    return who.run(["hg", "--config", "trusted.users=*", "--config", "ui.username=u", *args],
                   cwd=cwd, env={"HGRCPATH": ""})


HG_PLANT = ("(echo '[hooks]' >> hg/.hg/hgrc) 2>/dev/null && echo WROTE-HGRC; "
            "(echo 0123456789abcdef0123 > jj/.jj/repo/config-id) 2>/dev/null && echo WROTE-JJ; "
            "(mv hg/.hg hg/.hg-old) 2>/dev/null && echo RENAMED; "
            "echo more >> hg/f && hg -R hg --config ui.username=a commit -q -m x && "
            "echo COMMITTED; hg init new && "
            "printf '[hooks]\\npre-status = echo HOOK-RAN\\n' > new/.hg/hgrc && echo PLANTED; "
            "hg init lib && mv lib/.hg .cache-lib && ln -s ../.cache-lib lib/.hg && "
            "printf '[hooks]\\npre-status = echo LINK-RAN\\n' > .cache-lib/hgrc && "
            "echo 'lib = lib' > .hgsub && echo LINKED")


def test_mercurial_and_jujutsu_controls_are_read_only_and_plants_go(
        who: Identity, lab: Lab) -> None:
    """Mercurial runs what ``.hg/hgrc`` names on ``hg status``: like git's config it is
    read-only inside (and ``.hg`` cannot be renamed away), while commits still work; an
    ``hgrc`` planted in a repository the agent made goes to the quarantine after the run,
    and so do a ``.hg`` made a link to a folder of another name and a ``.hgsub`` naming
    that repository as a subrepository (review 25: host ``hg commit`` at the top loaded
    its config).  jj's config id is read-only too.  Control: the naive sandbox writes
    both, and host ``hg status`` in either planted repository runs its hook."""
    _runs_as(who, lab)
    subprocess.run(["hg", "init", str(lab.project / "hg")], check=True, capture_output=True)
    (lab.project / "hg" / ".hg" / "hgrc").write_text("[ui]\nusername = me\n")
    (lab.project / "hg" / "f").write_text("one\n")
    subprocess.run(["hg", "-R", str(lab.project / "hg"), "--config", "ui.username=u", "commit",
                    "-A", "-q", "-m", "first"], check=True, capture_output=True,
                   env={"HGRCPATH": "", "PATH": "/usr/bin:/bin"})
    (lab.project / "jj" / ".jj" / "repo").mkdir(parents=True)
    (lab.project / "jj" / ".jj" / "repo" / "config-id").write_text("ab" * 10)
    lab.own(lab.project)
    r = agent(who, lab, HG_PLANT)
    assert r.returncode == 0, r.stderr
    assert "WROTE" not in r.stdout and "RENAMED" not in r.stdout, r.stdout
    assert "COMMITTED" in r.stdout and "PLANTED" in r.stdout, r.stdout + r.stderr
    assert (lab.project / "hg" / ".hg" / "hgrc").read_text() == "[ui]\nusername = me\n"
    assert "new/.hg/hgrc" in r.stderr and "quarantined" in r.stderr, r.stderr
    assert not (lab.project / "new" / ".hg" / "hgrc").exists()
    assert "HOOK-RAN" not in _host_hg(who, lab.project / "new", "status").stdout
    assert "LINKED" in r.stdout and not (lab.project / "lib" / ".hg").is_symlink(), r.stderr
    assert not (lab.project / ".hgsub").exists(), r.stderr
    assert "LINK-RAN" not in _host_hg(who, lab.project / "lib", "status").stdout
    for planted in ("new", "lib", ".cache-lib"):
        shutil.rmtree(lab.project / planted)
    ctl = naive(who, lab, HG_PLANT)
    assert "WROTE-HGRC" in ctl.stdout and "WROTE-JJ" in ctl.stdout, ctl.stdout + ctl.stderr
    assert "HOOK-RAN" in _host_hg(who, lab.project / "new", "status").stdout
    assert "LINK-RAN" in _host_hg(who, lab.project / "lib", "status").stdout


def test_symlink_to_ssh_in_the_project_shows_nothing(who: Identity, lab: Lab) -> None:
    (lab.project / "sshlink").symlink_to(lab.home / ".ssh")
    lab.own(lab.project)
    script = "ls -A sshlink/ 2>/dev/null; cat sshlink/id_ed25519 2>/dev/null; echo end"
    r = agent(who, lab, script)
    assert r.returncode == 0 and r.stdout.strip() == "end" and lab.token not in r.stdout
    assert lab.token in naive(who, lab, script).stdout


@pytest.mark.parametrize("where", ["home", "root", "ssh-holder", "etc"])
def test_launch_directory_policy_refuses(who: Identity, lab: Lab, where: str) -> None:
    holder = lab.home / "dev" / "holder"
    (holder / ".ssh").mkdir(parents=True)
    lab.own(holder)
    cwd = {"home": lab.home, "root": Path("/"), "ssh-holder": holder, "etc": Path("/etc")}[where]
    r = who.corral("agent", "--", "/bin/true", cwd=cwd)
    assert r.returncode == 125 and r.stderr.startswith("corral: error: refusing"), r.stderr
    assert r.stderr.count("\n") == 1


def test_symlinked_project_path_does_not_widen(who: Identity, lab: Lab) -> None:
    link = lab.home / "dev" / "looks-like-a-project"
    link.symlink_to(lab.home)
    lab.own(link)
    r = who.corral("agent", "--", "/bin/true", cwd=link)
    assert r.returncode == 125 and "home directory" in r.stderr


def test_symlinked_hooks_are_refused(who: Identity, lab: Lab) -> None:
    hooks = lab.project / ".git" / "hooks"
    shutil.rmtree(hooks)
    (lab.project / "myhooks").mkdir()
    hooks.symlink_to(lab.project / "myhooks")
    lab.own(lab.project)
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "symbolic link" in r.stderr


def test_environment_is_only_what_the_profile_names(who: Identity, lab: Lab) -> None:
    secret = f"sk-canary-{uuid.uuid4().hex}"
    other = f"other-{uuid.uuid4().hex}"
    r = agent(who, lab, "env", "--profile", "claude",
              env={"ANTHROPIC_API_KEY": secret, "OTHER_SECRET": other})
    assert r.returncode == 0, r.stderr
    assert f"ANTHROPIC_API_KEY={secret}" in r.stdout and other not in r.stdout
    assert "ANTHROPIC_API_KEY" in r.stderr and secret not in r.stderr
    assert other not in r.stderr and "OTHER_SECRET" not in r.stderr
    named = agent(who, lab, "env", "--env", "OTHER_SECRET", env={"OTHER_SECRET": other})
    assert other in named.stdout  # control: naming it passes it


def test_shell_runs_one_command_under_the_same_rules(who: Identity, lab: Lab) -> None:
    r = who.corral("shell", "-c", READ_SECRETS.replace("$H", str(lab.home))
                   + "; echo ok > from-shell; exit 7",
                   cwd=lab.project)
    assert r.returncode == 7 and lab.token not in r.stdout
    assert (lab.project / "from-shell").read_text() == "ok\n"
    refused = who.corral("shell", "-c", "true", cwd=lab.home)
    assert refused.returncode == 125


def test_dry_run_shows_the_whole_layout(who: Identity, lab: Lab) -> None:
    r = who.corral("agent", "--dry-run", "--profile", "claude", "--", "/bin/true",
                   cwd=lab.project)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"rw      dir  {lab.project}  (the project)" in out
    assert f"hidden  file {lab.project}/.env" in out
    assert f"ro      dir  {lab.project}/.git/hooks" in out
    assert f"ro      dir  {lab.project}/nested/.git/hooks" in out
    assert "--ro-bind / /" in out


def test_root_refuses_a_root_owned_project(root: Identity) -> None:
    mine = root.tmp / "rootproj"
    mine.mkdir()
    r = root.corral("agent", "--", "/bin/true", cwd=mine)
    assert r.returncode == 125 and "owned by root" in r.stderr


def test_scan_fails_closed_where_the_launcher_cannot_read(who: Identity, lab: Lab) -> None:
    locked = lab.project / "locked"
    locked.mkdir()
    lab.own(locked)
    locked.chmod(0)
    r = agent(who, lab, "true")
    if who.is_root:  # root's scan reads everything: the launch goes ahead
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 125 and "cannot scan" in r.stderr, r.stderr


def test_agent_mode_has_the_kernel_layers(who: Identity, lab: Lab) -> None:
    script = "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; " \
             "(unshare -U true) 2>/dev/null && echo NEW-USERNS; true"
    r = agent(who, lab, script)
    assert r.returncode == 0, r.stderr
    assert "Seccomp:\t2" in r.stdout and "NoNewPrivs:\t1" in r.stdout
    assert "NEW-USERNS" not in r.stdout
    ctl = naive(who, lab, script)
    assert "Seccomp:\t0" in ctl.stdout and "NEW-USERNS" in ctl.stdout


def test_agent_reaches_only_allowed_names_through_the_proxy(who: Identity, lab: Lab) -> None:
    with Origin() as origin:
        o = f"origin.test:{origin.port}"
        script = (f"curl -sS http://{o}/model; "
                  f"curl -sS -o /dev/null -w '%{{http_code}}' http://other.test:{origin.port}/; "
                  f"echo; (curl -sS --noproxy '*' http://127.0.0.1:{origin.port}/ 2>/dev/null "
                  "|| echo direct-refused)")
        r = agent(who, lab, script, "--allow-domain", "origin.test",
                  "--resolve", "origin.test:127.0.0.1")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"GET /model host={o}", "403", "direct-refused"]
        assert "network: only origin.test, through corral's proxy" in r.stderr
        assert origin.connections == 1
        # Control: the naive sandbox shares the host network and reaches it directly.
        ctl = naive(who, lab, f"curl -sS --noproxy '*' http://127.0.0.1:{origin.port}/x")
        assert ctl.stdout.startswith("GET /x") and origin.connections == 2


def test_shell_takes_the_options_a_shell_does(who: Identity, lab: Lab) -> None:
    """Codex runs `bash -lc CMD`; a $SHELL wrapper passes those words on."""
    probe = "shopt -q login_shell && echo LOGIN; cat ~/.fake-creds/token; echo ran"
    for words in (["-lc", probe], ["-l", "-c", probe]):
        r = who.corral("shell", *words, cwd=lab.project)
        assert r.returncode == 0 and r.stdout.split() == ["LOGIN", "ran"], (words, r)
    plain = who.corral("shell", "-c", probe, cwd=lab.project)
    assert plain.stdout.split() == ["ran"]  # control: without -l, no login shell
    bad = who.corral("shell", "-c", "true", "extra", cwd=lab.project)
    assert bad.returncode == 125 and bad.stderr.count("\n") == 1


def test_shell_prefix_runs_claudes_one_string_and_reports_its_directory(
        who: Identity, lab: Lab) -> None:
    """CLAUDE_CODE_SHELL_PREFIX gets ONE argument; its cwd file reaches the host."""
    cwd_file = Path(f"/tmp/claude-{uuid.uuid4().hex[:12]}-cwd")
    string = (f"eval 'cd nested && cat {lab.home}/.fake-creds/token; echo ran' < /dev/null "
              f"&& pwd -P >| {cwd_file}")
    try:
        r = who.corral("shell", "--prefix", string, cwd=lab.project)
        assert r.returncode == 0 and r.stdout == "ran\n", r
        assert cwd_file.read_text().strip() == f"{lab.project}/nested"
        assert cwd_file.stat().st_uid == lab.uid
        two = who.corral("shell", "--prefix", "true", "true", cwd=lab.project)
        assert two.returncode == 125 and "one argument" in two.stderr
    finally:
        cwd_file.unlink(missing_ok=True)
    # Control: the same string under -c leaves the cwd file in the sandbox's own /tmp.
    who.corral("shell", "-c", string, cwd=lab.project)
    assert not cwd_file.exists()


def test_version(who: Identity) -> None:
    r = who.corral("--version")
    assert r.returncode == 0 and r.stdout.startswith("corral 0.")


def test_the_network_line_leaves_out_what_deny_removed(who: Identity, lab: Lab) -> None:
    flags = ("--allow-domain", "origin.test", "--allow-domain", "gone.test",
             "--allow-domain", "*.cdn.test")
    r = agent(who, lab, "true", *flags, "--deny-domain", "gone.test",
              "--deny-domain", "secret.cdn.test")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("corral: network:"))
    assert line == ("corral: network: only origin.test, *.cdn.test, through corral's proxy "
                    "(never secret.cdn.test)")
    # Control: without the deny rule the same name is listed.
    ctl = agent(who, lab, "true", *flags)
    assert "corral: network: only origin.test, gone.test, *.cdn.test, through corral's " \
           "proxy" in ctl.stderr


def test_a_writable_path_that_is_a_link_is_refused_in_one_line(who: Identity, lab: Lab
                                                                ) -> None:
    """``--rw`` naming a link to a folder in the home ended in a traceback (the tree is
    opened without following its last link; seen by review 7).  Now one line names the
    folder to give instead.  Control: the folder itself is taken."""
    target = lab.home / "dev" / "cache-target"
    target.mkdir()
    link = lab.home / "dev" / "cache-link"
    link.symlink_to(target)
    lab.own(target)
    lab.own(link)
    r = who.corral("agent", "--rw", str(link), "--", "/bin/true", cwd=lab.project)
    assert r.returncode == 125 and "symbolic link" in r.stderr, r
    assert r.stderr.count("\n") == 1, r.stderr
    ok = who.corral("agent", "--rw", str(target), "--", "/bin/true", cwd=lab.project)
    assert ok.returncode == 0, ok


def _thread_masks(who: Identity, args: list[str], cwd: Path) -> dict[str, int]:
    """Start corral, wait for its payload to print ``ready``, read every thread's blocked
    signals (``SigBlk`` in /proc), end it: {thread id: mask}."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen([*who.prefix(), "-m", "corral", *args], env=who.environ(),
                            cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the payload is running: every thread is started
        assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
        masks = {}
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            status = Path(f"/proc/{proc.pid}/task/{tid}/status").read_text()
            masks[tid] = int(status.split("SigBlk:")[1].split()[0], 16)
        return masks
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


@pytest.mark.parametrize("mode", ["run", "agent"])
def test_corrals_own_threads_leave_every_signal_to_the_main_thread(
        who: Identity, lab: Lab, mode: str) -> None:
    """Python runs a signal's handler in the main thread only, once that thread wakes: a
    signal the kernel gave one of corral's own threads waited for the payload's next output
    (seen in CI: a terminal's resize never reached the payload).  So none of them takes one.
    """
    import signal

    _runs_as(who, lab)
    script = ["--", "/bin/sh", "-c", "echo ready; sleep 60"]
    # run: a reused workspace's disk limit (its watch thread: a fresh workspace started by
    # root is an image, whose use the supervision loop reads itself); agent, in the lab's
    # git project: the live watch of its git directories.
    ws = who.tmp / "ws"
    ws.mkdir()
    if who.is_root:
        os.chown(ws, 65534, 65534)
    args = ["run", "--disk", "64M", "--workspace", str(ws), *script] if mode == "run" \
        else ["agent", *script]
    masks = _thread_masks(who, args, lab.project)
    main = masks.pop(str(next(iter(sorted(masks, key=int)))))
    assert masks, "no thread of corral's own was running"
    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH,
              signal.SIGCONT, signal.SIGUSR1, signal.SIGALRM, signal.SIGCHLD)
    for tid, mask in masks.items():
        assert all(mask & (1 << (sig - 1)) for sig in wanted), (tid, hex(mask))
    # Control: the main thread, which takes them, blocks none of them (so the mask read is
    # what the kernel uses, and a thread that takes a signal would show here).
    assert not any(main & (1 << (sig - 1)) for sig in wanted), hex(main)
