"""Issue 16: nothing the payload writes may act on the host.

One test per reproduced escape, as root and as the unprivileged user, each beside its
negative control: the same attempt with the protection removed (the seed's naive
sandbox, a planted file obeyed the way main obeyed it, a kill that skips the unwinding)
succeeds, so that the test could fail.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent_lab import Lab, agent, git, naive
from conftest import Identity

pytestmark = pytest.mark.sandbox


def _own(lab: Lab, *paths: Path) -> None:
    lab.own(*paths)


# --- principle 1: resolution never runs anything -------------------------------------

FAKE_SHIM = """#!/bin/sh
# a pyenv shim, as far as main could tell
export PYENV_ROOT="{root}"
exec "{root}/libexec/pyenv" exec "$(basename "$0")" "$@"
"""
FAKE_PYENV = "#!/bin/sh\necho ran > {marker}\necho /bin/true\n"


def _plant_pyenv(lab: Lab, marker: Path) -> tuple[Path, Path]:
    root = lab.project / "fakepyenv"
    (root / "libexec").mkdir(parents=True)
    (root / "libexec" / "pyenv").write_text(FAKE_PYENV.format(marker=marker))
    (root / "libexec" / "pyenv").chmod(0o755)
    bindir = lab.project / "bin"
    bindir.mkdir()
    for name in ("x", "python3"):
        (bindir / name).write_text(FAKE_SHIM.format(root=root))
        (bindir / name).chmod(0o755)
    _own(lab, lab.project)
    return bindir, root


def test_resolving_the_command_never_runs_a_planted_file(who: Identity, lab: Lab) -> None:
    """main ran $PYENV_ROOT/libexec/pyenv, with PYENV_ROOT read from any '#!' file that
    mentioned pyenv: for run|shell|agent -- /path/in/project/x, under --dry-run too, and
    for a command found through a writable PATH entry."""
    marker = lab.home / "dev" / "RAN-ON-THE-HOST"
    bindir, root = _plant_pyenv(lab, marker)
    path = f"{bindir}:{os.environ['PATH']}"
    attempts = [
        ("run", "--dry-run", "--", str(bindir / "x")),
        ("shell", "--dry-run", "--", str(bindir / "x")),
        ("shell", "--", str(bindir / "x")),
        ("agent", "--", str(bindir / "x")),
        ("run", "--dry-run", "--", "python3", "-c", "pass"),
    ]
    (bindir / "bwrap").write_text(f"#!/bin/sh\necho ran > {marker}\n")  # for detect()
    (bindir / "bwrap").chmod(0o755)
    _own(lab, bindir)
    for args in attempts:
        who.corral(*args, cwd=lab.project, env={"PATH": path})
        assert not marker.exists(), f"corral {' '.join(args)} ran the planted pyenv"
    import shutil

    assert shutil.which("bwrap", path=path) == str(bindir / "bwrap")  # main's way found it
    # Control: what main did with the shim (run its PYENV_ROOT's pyenv) runs the plant.
    subprocess.run([str(root / "libexec" / "pyenv"), "which", "python3"], check=True,
                   capture_output=True)
    assert marker.exists()


def test_a_project_python_version_chooses_only_among_installed_versions(tmp_path: Path
                                                                         ) -> None:
    from corral import interp

    versions = tmp_path / "pyenv" / "versions"
    for v in ("3.99.1", "other"):
        (versions / v / "bin").mkdir(parents=True)
        (versions / v / "bin" / "python3").write_text("#!/bin/sh\n")
        (versions / v / "bin" / "python3").chmod(0o755)
    (tmp_path / "pyenv" / "shims").mkdir()
    shim = tmp_path / "pyenv" / "shims" / "python3"
    shim.write_text("#!/bin/sh\n")
    shim.chmod(0o755)
    project = tmp_path / "proj"
    project.mkdir()
    old = os.getcwd()
    os.chdir(project)
    env = {"PYENV_ROOT": str(tmp_path / "pyenv"), "PYENV_VERSION": ""}
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update(env)
        os.environ.pop("PYENV_VERSION")
        (project / ".python-version").write_text("3.99.1\n")
        found = interp.which_command(["python3"], str(shim.parent))
        assert found == str(versions / "3.99.1" / "bin" / "python3")  # control: a name works
        for planted in ("../../../home/u/.ssh", "/etc", "..", "../other/../3.99.1"):
            (project / ".python-version").write_text(planted + "\n")
            with pytest.raises(Exception, match="none of the versions"):
                interp.which_command(["python3"], str(shim.parent))
    finally:
        os.chdir(old)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_dry_run_creates_nothing(who: Identity, lab: Lab) -> None:
    """--dry-run shows what a launch would make (hooks/, placeholders) without making it."""
    subprocess.run(["rm", "-rf", str(lab.project / ".git" / "hooks")], check=True)
    config = lab.project / ".git" / "config"
    config.write_text(config.read_text() + "[include]\n\tpath = ../later.inc\n")
    r = who.corral("agent", "--dry-run", "--", "/bin/true", cwd=lab.project)
    assert r.returncode == 0 and ".git/hooks" in r.stdout and "later.inc" in r.stdout, r
    assert not (lab.project / ".git" / "hooks").exists()
    assert not (lab.project / "later.inc").exists()
    # Control: the launch itself makes both (and removes the placeholder after).
    assert agent(who, lab, "test -f later.inc && echo PLACED").stdout.strip() == "PLACED"
    assert (lab.project / ".git" / "hooks").is_dir()


def test_a_venv_cannot_choose_what_is_mounted(who: Identity, lab: Lab) -> None:
    """``home = ~/.ssh/bin`` in a venv's pyvenv.cfg made main mount ~/.ssh."""
    venv = lab.project / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {lab.home}/.ssh/bin\nversion = 3.11.7\n")
    (venv / "bin" / "python3").symlink_to(f"{lab.home}/.ssh/bin/python3")
    _own(lab, lab.project)
    (lab.home / ".ssh" / "known_hosts").write_text(lab.token + "\n")
    _own(lab, lab.home / ".ssh")
    script = f"cat {lab.home}/.ssh/known_hosts; echo"
    r = who.corral("run", "--venv", str(venv), "--", "/bin/sh", "-c", script, cwd=lab.project)
    assert lab.token not in r.stdout, r
    assert r.returncode == 125 and "virtualenv" in r.stderr, r.stderr
    # Control: mounted (here by name, with --ro, as main mounted it), the file is read.
    ctl = who.corral("run", "--ro", f"{lab.home}/.ssh", "--", "/bin/sh", "-c", script,
                     cwd=lab.project)
    assert lab.token in ctl.stdout, ctl


def test_no_parent_is_wider_inside_than_on_the_host(root: Identity, lab: Lab) -> None:
    """Started by root, /root is 0700: a parent bwrap makes inside must not open it."""
    secret_dir = Path("/root") / f".corral-test-{os.getpid()}"
    (secret_dir / "inner").mkdir(parents=True)
    secret_dir.chmod(0o700)
    (secret_dir / "inner" / "f").write_text("root's\n")
    (secret_dir / "inner").chmod(0o755)
    try:
        from corral import reach

        modes = reach.dir_modes([str(secret_dir / "inner")], lab.uid, lab.gid)
        assert modes["/root"] & 0o077 == 0 and modes[str(secret_dir)] & 0o077 == 0
        # Control: what bwrap makes without a mode is 0755, which would open it.
        assert modes[str(secret_dir / "inner")] & 0o055 == 0o055
    finally:
        subprocess.run(["rm", "-rf", str(secret_dir)], check=True)


# --- principle 2: by descriptor, as the owner ------------------------------------------

def test_root_never_chowns_a_host_file_through_a_swapped_component(root: Identity,
                                                                   lab: Lab) -> None:
    """main made hooks/ by path and chowned it by path: a swapped component turned the
    chown onto a root-owned file outside.  Raced here for real, both ways."""
    victim = root.tmp / "victim"
    victim.mkdir()
    (victim / "hooks").write_text("root's own\n")
    lib = lab.project / "lib"
    git(lib.parent, "init", "-q", "lib")
    subprocess.run(["rm", "-rf", str(lib / ".git" / "hooks")], check=True)  # made each try
    (lib / "decoy").symlink_to(victim)
    _own(lab, lab.project)
    script = f"""
import ctypes, os, sys
sys.path.insert(0, {str(root.src or '')!r})
from corral import discover, fsops, repos
from corral.locate import Roots
libc = ctypes.CDLL(None, use_errno=True)
lib, project = {str(lib)!r}, {str(lab.project)!r}
swapper = os.fork()  # another process (another core, no shared GIL), like a sandbox
if swapper == 0:
    a, b = (lib + "/.git").encode(), (lib + "/decoy").encode()
    while True:  # renameat2(RENAME_EXCHANGE) of lib/.git and lib/decoy
        libc.syscall(316, -100, a, -100, b, 2)
mode = sys.argv[1]
try:
    for i in range(400 if mode == "fsops" else 200000):
        for gitdir in (lib + "/.git", lib + "/decoy"):
            try:
                os.rmdir(gitdir + "/hooks")
            except OSError:
                pass
        try:
            if mode == "fsops":
                roots = Roots([fsops.Tree(project, ({lab.uid}, {lab.gid}))])
                try:
                    discover.scan(roots.trees[0], repos.Scope(roots, "/nonexistent", True))
                finally:
                    roots.close()
            else:  # main's _ensure_dir: mkdir by path, then chown by path
                p = lib + "/.git/hooks"
                os.mkdir(p, 0o755)
                os.chown(p, {lab.uid}, {lab.gid})
        except Exception:
            pass
        if os.stat({str(victim / 'hooks')!r}).st_uid != 0:
            print("CHOWNED", i); break
finally:
    os.kill(swapper, 9); os.waitpid(swapper, 0)
"""
    def attempt(mode: str) -> str:
        done = subprocess.run([root.prefix()[0], "-c", script, mode], capture_output=True,
                              text=True, timeout=300)
        return done.stdout + done.stderr
    assert "CHOWNED" not in attempt("fsops")
    assert (victim / "hooks").stat().st_uid == 0
    assert "CHOWNED" in attempt("by-path")  # control: main's way is won by the race


def test_a_fifo_or_huge_control_file_is_refused_at_once(who: Identity, lab: Lab) -> None:
    """A FIFO named .git hung every later launch (an open without O_NONBLOCK)."""
    sub = lab.project / "sub"
    sub.mkdir()
    os.mkfifo(sub / ".git")
    _own(lab, lab.project)
    started = time.monotonic()
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "fifo" in r.stderr, r.stderr
    assert time.monotonic() - started < 60
    (sub / ".git").unlink()
    config = lab.project / ".git" / "config"
    saved = config.read_bytes()
    config.write_bytes(saved + b"#" * (2 << 20))
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "larger than" in r.stderr, r.stderr
    config.unlink()
    os.mkfifo(config)
    _own(lab, lab.project)
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "fifo" in r.stderr, r.stderr
    # Control: a plain open of such a FIFO, as main did, does not return.
    opened: list[int] = []
    t = threading.Thread(target=lambda: opened.append(os.open(config, os.O_RDONLY)),
                         daemon=True)
    t.start()
    t.join(2)
    assert not opened, "the FIFO opened without a writer"
    with open(config, "wb") as f:  # let the thread go
        f.write(b"")
    t.join(10)
    config.unlink()
    config.write_bytes(saved)
    _own(lab, config)


# --- principle 3: renaming a parent ----------------------------------------------------

def test_renaming_a_parent_cannot_replace_what_is_protected(who: Identity, lab: Lab) -> None:
    (lab.project / "pkg" / ".vscode").mkdir(parents=True)
    (lab.project / "pkg" / ".vscode" / "tasks.json").write_text("{}\n")
    _own(lab, lab.project)
    script = ("(mv nested nested.orig) 2>/dev/null && echo MOVED-REPO; "
              "(mv pkg pkg.orig) 2>/dev/null && echo MOVED-PKG; "
              "mv README.md README.txt && mv README.txt README.md && echo RENAMED-FILE")
    r = agent(who, lab, script)
    assert "MOVED" not in r.stdout and "RENAMED-FILE" in r.stdout, r
    assert (lab.project / "nested" / ".git").is_dir()
    ctl = naive(who, lab, script)
    assert "MOVED-REPO" in ctl.stdout and "MOVED-PKG" in ctl.stdout
    os.rename(lab.project / "nested.orig", lab.project / "nested")
    os.rename(lab.project / "pkg.orig", lab.project / "pkg")


@pytest.mark.usefixtures("each_init")  # the init checks the mounts
def test_the_init_checks_every_component_and_cgroups_are_hidden(who: Identity, lab: Lab
                                                                ) -> None:
    (lab.project / "conf").mkdir()
    (lab.project / "conf" / ".env").write_text(f"K={lab.token}\n")
    _own(lab, lab.project)
    r = agent(who, lab, "cat conf/.env; ls /sys/fs/cgroup | wc -l")
    assert lab.token not in r.stdout and r.stdout.split()[-1] == "0", r
    show = ("import json, sys\nfrom corral import api\nfrom corral.profiles import "
            "load_profile\nsb, _ = api.plan_agent(['/bin/true'], load_profile('generic'), "
            "project=sys.argv[1])\nprint(json.dumps(sb.init_config['expect_mounts']))\n")
    done = who.run([who.prefix()[-1], "-c", show, str(lab.project)], cwd=lab.project)
    assert done.returncode == 0, done.stderr
    import json

    expected = {e[0]: e[1] for e in json.loads(done.stdout)}
    assert expected[str(lab.project / "conf")] == "pin"  # the parent of a mask is pinned
    assert expected[str(lab.project)] == "pin"  # and the tree's top is checked too
    ctl = naive(who, lab, "ls /sys/fs/cgroup | wc -l")
    assert int(ctl.stdout.split()[-1]) > 0


# --- principle 4: the audit, on every exit path, and the live watch --------------------

def test_no_commondir_can_appear_while_the_run_lives(who: Identity, lab: Lab) -> None:
    """Host git (a prompt, an editor) reads a commondir the moment it appears: none can be
    made, however it is written, while the agent runs."""
    plant = ("for i in 1 2 3; do (echo ../elsewhere > .git/c.tmp && mv -f .git/c.tmp "
             ".git/commondir) 2>/dev/null && echo WROTE; (echo ../x > .git/commondir) "
             "2>/dev/null && echo WROTE; rm -f .git/c.tmp; done; echo PLANTED; sleep 20")
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "agent", "--", "/bin/sh", "-c",
                             plant], cwd=lab.project, env=who.environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    commondir = lab.project / ".git" / "commondir"
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "PLANTED"
        assert commondir.read_text() == ".\n"  # corral's placeholder: the git dir itself
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not commondir.exists()  # the placeholder is gone with the run
    # Control: the naive sandbox writes it, and the host's git obeys it.
    ctl = naive(who, lab, "echo ../elsewhere > .git/commondir && echo WROTE")
    assert "WROTE" in ctl.stdout and commondir.read_text() == "../elsewhere\n"
    commondir.unlink()


PLANT_HOOK = ("git init -q planted && printf '#!/bin/sh\\necho pwned\\n' > "
              "planted/.git/hooks/pre-commit && chmod +x planted/.git/hooks/pre-commit && "
              "cp /bin/true setid && chmod 4755 setid 2>/dev/null; echo PLANTED; "
              "touch planted/done; {end}")
# An exception in corral's own supervision, once the payload has planted: the API must
# still audit (run as the identity under test, through the real CLI entry point).
CRASH = """
import sys
from corral import launch
real = launch.Launch.supervise
def supervise(self):
    while self.proc.poll() is None:
        import os, time
        if os.path.exists("planted/done"):  # after PLANTED was written
            raise RuntimeError("corral's supervision crashed")
        time.sleep(0.05)
    return real(self)
launch.Launch.supervise = supervise
from corral.cli import main
main(sys.argv[1:])
"""


def _start(who: Identity, lab: Lab, end: str, how: str = "") -> subprocess.Popen[str]:
    args = ["agent", "--", "/bin/sh", "-c", PLANT_HOOK.format(end=end)]
    entry = ["-c", CRASH] if how == "supervision-crash" else ["-m", "corral"]
    return subprocess.Popen([*who.prefix(), *entry, *args], cwd=lab.project,
                            env=who.environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGINT", "payload-crash",
                                 "supervision-crash"])
def test_the_audit_runs_on_every_exit_path(who: Identity, lab: Lab, how: str) -> None:
    """A hook planted in a new repository and a set-uid file, then the run ends badly."""
    hook = lab.project / "planted" / ".git" / "hooks" / "pre-commit"
    end = {"payload-crash": "kill -SEGV $$", "supervision-crash": "sleep 60"}.get(how,
                                                                                 "sleep 60")
    proc = _start(who, lab, end, how)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "PLANTED"
    if how.startswith("SIG"):
        proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    assert not hook.exists(), err
    assert "quarantined" in err and "pre-commit" in err, err
    setid = lab.project / "setid"
    assert not setid.exists() or not setid.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    # Control: killed without unwinding (SIGKILL), corral leaves the plant in place.
    subprocess.run(["rm", "-rf", str(lab.project / "planted"), str(setid)], check=True)
    proc = _start(who, lab, "sleep 60")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "PLANTED"
    proc.kill()
    proc.communicate(timeout=120)
    assert hook.exists()
    subprocess.run(["rm", "-rf", str(lab.project / "planted"), str(setid)], check=True)


NO_FILTER = """
import sys
from corral import seccomp
seccomp.for_policy = lambda policy: None  # this layer removed: the audit must hold alone
from corral.cli import main
main(sys.argv[1:])
"""


def test_set_id_bits_left_by_agent_mode_are_cleared(who: Identity, lab: Lab) -> None:
    """seccomp refuses set-id modes; the audit is the second layer, shown here with the
    filter taken out (through the real CLI), so that the bits really are set inside."""
    script = "cp /bin/true setid && chmod 6755 setid && stat -c %a setid"
    r = who.run([who.prefix()[-1], "-c", NO_FILTER, "agent", "--", "/bin/sh", "-c", script],
                cwd=lab.project)
    assert r.returncode == 0 and r.stdout.split()[-1] == "6755", r.stderr
    assert "cleared set-id bits" in r.stderr
    mode = (lab.project / "setid").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID), oct(mode)
    (lab.project / "setid").unlink()
    ctl = naive(who, lab, "cp /bin/true setid && chmod 4755 setid")
    assert ctl.returncode == 0 and (lab.project / "setid").stat().st_mode & stat.S_ISUID
    (lab.project / "setid").unlink()


# --- principle 5: git read the way git reads it ----------------------------------------

def _host_git(lab: Lab, *args: str) -> str:
    done = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=lab.project,
                          capture_output=True, text=True, env={**os.environ,
                                                               "HOME": str(lab.home)})
    return done.stdout + done.stderr


CONFIGS = {
    # an include with ~/ that points into the project
    "tilde-include": ("[include]\n\tpath = ~/{rel}/evil.inc\n", "evil.inc"),
    # an inline comment after a relative hook folder
    "inline-comment": ("[core]\n\thooksPath = tools/hooks ; the team's hooks\n",
                       "tools/hooks/pre-commit"),
    # an include that is missing at launch
    "missing-include": ("[include]\n\tpath = ../later.inc\n", "later.inc"),
    # extensions.worktreeConfig with no config.worktree yet
    "worktree-config": ("[extensions]\n\tworktreeConfig = true\n", ".git/config.worktree"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_git_config_is_read_as_git_reads_it(who: Identity, lab: Lab, case: str) -> None:
    text, target = CONFIGS[case]
    rel = os.path.relpath(lab.project, lab.home)
    config = lab.project / ".git" / "config"
    config.write_text(config.read_text() + text.format(rel=rel))
    (lab.project / "tools" / "hooks").mkdir(parents=True)
    (lab.project / "tools" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    if case == "tilde-include":
        (lab.project / "evil.inc").write_text("")
    _own(lab, lab.project)
    evil = "[core]\n\tfsmonitor = ./evil.sh\n"
    script = f"(printf '{evil}' >> {target}) 2>/dev/null && echo WROTE; true"
    r = agent(who, lab, script)
    assert r.returncode == 0 and "WROTE" not in r.stdout, (r.stdout, r.stderr)
    assert "evil.sh" not in _host_git(lab, "config", "--get", "core.fsmonitor")
    if case == "missing-include":  # the placeholder is gone again
        assert not (lab.project / "later.inc").exists()
    # Control: without corral the write lands, and host git obeys it.
    ctl = naive(who, lab, script.replace("2>/dev/null", ""))
    assert "WROTE" in ctl.stdout, ctl.stderr
    if target != "tools/hooks/pre-commit":
        assert "evil.sh" in _host_git(lab, "config", "--get", "core.fsmonitor")


def test_a_symlinked_hook_target_is_read_only(who: Identity, lab: Lab) -> None:
    (lab.project / "scripts").mkdir()
    (lab.project / "scripts" / "pre-commit").write_text("#!/bin/sh\n")
    (lab.project / ".git" / "hooks" / "pre-commit").symlink_to("../../scripts/pre-commit")
    _own(lab, lab.project)
    script = "(echo evil >> .git/hooks/pre-commit) 2>/dev/null && echo WROTE; true"
    r = agent(who, lab, script)
    assert r.returncode == 0 and "WROTE" not in r.stdout, r
    assert "evil" not in (lab.project / "scripts" / "pre-commit").read_text()
    ctl = naive(who, lab, script)
    assert "WROTE" in ctl.stdout
    # A link on the way inside the project could be re-pointed: refused at launch.
    (lab.project / "scripts-link").symlink_to("scripts")
    (lab.project / ".git" / "hooks" / "pre-commit").unlink()
    (lab.project / ".git" / "hooks" / "pre-commit").symlink_to("../../scripts-link/pre-commit")
    _own(lab, lab.project)
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "symbolic link" in r.stderr, r.stderr


def test_a_hard_linked_hook_is_refused(who: Identity, lab: Lab) -> None:
    (lab.project / "scripts").mkdir()
    (lab.project / "scripts" / "pre-commit").write_text("#!/bin/sh\n")
    os.link(lab.project / "scripts" / "pre-commit", lab.project / ".git" / "hooks" / "pre-commit")
    (lab.project / ".vscode").mkdir()
    os.link(lab.project / "scripts" / "pre-commit", lab.project / ".vscode" / "tasks.json")
    _own(lab, lab.project)
    r = agent(who, lab, "true")
    assert r.returncode == 125 and "hard link" in r.stderr, r.stderr
    ctl = naive(who, lab, "echo evil >> scripts/pre-commit")
    assert ctl.returncode == 0
    assert "evil" in (lab.project / ".git" / "hooks" / "pre-commit").read_text()


def test_a_template_folder_named_by_the_global_config_is_read_only(who: Identity,
                                                                    lab: Lab) -> None:
    rel = os.path.relpath(lab.project, lab.home)
    (lab.home / ".gitconfig").write_text(f"[init]\n\ttemplateDir = ~/{rel}/tmpl\n")
    try:  # the home may be the test user's real one: never leave this behind
        (lab.project / "tmpl" / "hooks").mkdir(parents=True)
        _own(lab, lab.project, lab.home / ".gitconfig")
        script = "(echo evil > tmpl/hooks/post-checkout) 2>/dev/null && echo WROTE; true"
        r = agent(who, lab, script)
        assert r.returncode == 0 and "WROTE" not in r.stdout, r
        ctl = naive(who, lab, script)
        assert "WROTE" in ctl.stdout  # git init on the host would copy it into new repos
    finally:
        (lab.home / ".gitconfig").unlink()


def test_a_bare_repository_is_a_git_directory(who: Identity, lab: Lab) -> None:
    git(lab.project, "init", "-q", "--bare", "backup.git")
    _own(lab, lab.project)
    script = ("(printf '#!/bin/sh\\necho pwned\\n' > backup.git/hooks/post-receive) "
              "2>/dev/null && echo HOOK; (echo '[core] fsmonitor = x' >> backup.git/config) "
              "2>/dev/null && echo CONFIG; git init -q --bare new.git && "
              "printf '#!/bin/sh\\n' > new.git/hooks/post-receive && echo NEW; true")
    r = agent(who, lab, script)
    assert "HOOK" not in r.stdout and "CONFIG" not in r.stdout and "NEW" in r.stdout, r
    assert not (lab.project / "backup.git" / "hooks" / "post-receive").exists()
    assert not (lab.project / "new.git" / "hooks" / "post-receive").exists()  # quarantined
    assert "quarantined" in r.stderr
    subprocess.run(["rm", "-rf", str(lab.project / "new.git")], check=True)
    ctl = naive(who, lab, script)
    assert "HOOK" in ctl.stdout and "CONFIG" in ctl.stdout
    assert (lab.project / "new.git" / "hooks" / "post-receive").exists()


# --- the agent's program and git's credential store ------------------------------------

def test_the_program_prefix_shows_only_the_program(who: Identity, lab: Lab) -> None:
    cargo = lab.home / ".cargo"
    subprocess.run(["rm", "-rf", str(cargo)], check=True)
    (cargo / "bin").mkdir(parents=True)
    (cargo / "credentials.toml").write_text(f'[registry]\ntoken = "{lab.token}"\n')
    (cargo / "bin" / "fakecargo").write_text(
        f"#!/bin/sh\ncat {cargo}/credentials.toml {cargo}/bin/* 2>/dev/null; echo RAN\n")
    (cargo / "bin" / "fakecargo").chmod(0o755)
    (cargo / "bin" / "sibling.token").write_text(lab.token)
    # A code folder named like a credential file stays: node_modules/typebox/.../token/
    (cargo / "lib" / "token").mkdir(parents=True)
    (cargo / "lib" / "token" / "index.mjs").write_text("export const CODE = 1;\n")
    (cargo / "lib" / "token.d").mkdir()
    (cargo / "lib" / "token.d" / "token").write_text(lab.token)
    _own(lab, cargo)
    r = who.corral("shell", "--", str(cargo / "bin" / "fakecargo"), cwd=lab.project)
    assert r.returncode == 0 and "RAN" in r.stdout and lab.token not in r.stdout, r
    r = who.corral("shell", "--ro", str(cargo), "--", "/bin/sh", "-c",
                   f"cat {cargo}/credentials.toml; ls {cargo}", cwd=lab.project)
    assert lab.token not in r.stdout and "bin" in r.stdout, r  # hidden in --ro too
    r = who.corral("shell", "--ro", str(cargo), "--", "/bin/sh", "-c",
                   f"cat {cargo}/lib/token/index.mjs {cargo}/lib/token.d/token", cwd=lab.project)
    assert "CODE = 1" in r.stdout and lab.token not in r.stdout, r
    ctl = naive(who, lab, f"{cargo}/bin/fakecargo")
    assert lab.token in ctl.stdout
    subprocess.run(["rm", "-rf", str(cargo)], check=True)


def test_a_program_in_another_users_folder_is_refused(root: Identity, lab: Lab) -> None:
    prog = Path("/root") / f".corral-test-prog-{os.getpid()}" / "bin" / "tool"
    prog.parent.mkdir(parents=True)
    prog.write_text("#!/bin/sh\necho RAN\n")
    prog.chmod(0o755)
    try:
        r = root.corral("shell", "--", str(prog), cwd=lab.project)
        assert r.returncode == 125 and "cannot reach" in r.stderr, r
        # Control: the same program in the agent's own home runs.
        mine = lab.home / ".tools" / "bin" / "tool"
        mine.parent.mkdir(parents=True)
        mine.write_text(prog.read_text())
        mine.chmod(0o755)
        _own(lab, lab.home / ".tools")
        ok = root.corral("shell", "--", str(mine), cwd=lab.project)
        assert ok.returncode == 0 and "RAN" in ok.stdout, ok
    finally:
        subprocess.run(["rm", "-rf", str(prog.parent.parent), str(lab.home / ".tools")],
                       check=True)


def test_gits_credential_store_is_not_mounted(who: Identity, lab: Lab) -> None:
    gitdir = lab.home / ".config" / "git"
    gitdir.mkdir(parents=True, exist_ok=True)
    (gitdir / "credentials").write_text(f"https://u:{lab.token}@example.invalid\n")
    (gitdir / "config").write_text("[user]\n\tname = Config Visible\n")
    _own(lab, lab.home / ".config")
    script = f"cat {gitdir}/credentials; cat {gitdir}/config; echo"
    r = agent(who, lab, script)
    assert lab.token not in r.stdout and "Config Visible" in r.stdout, r
    ctl = naive(who, lab, script)
    assert lab.token in ctl.stdout


@pytest.mark.parametrize("how", ["exit", "SIGTERM"])
def test_a_reused_workspace_gets_its_git_back(who: Identity, how: str) -> None:
    """Run mode mounts nothing read-only inside its workspace: a reused one that holds a
    repository (the user's) is audited against copies taken at launch."""
    ws = who.tmp / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    config = (ws / ".git" / "config").read_text()
    who.chown(ws)
    plant = ("printf '[core]\\n\\tfsmonitor = ./evil\\n' >> .git/config && "
             "printf '#!/bin/sh\\n' > .git/hooks/pre-commit && chmod 4755 .git/hooks/pre-commit"
             " 2>/dev/null; echo PLANTED; " + ("sleep 60" if how == "SIGTERM" else "true"))
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--workspace", str(ws),
                             "--", "/bin/sh", "-c", plant], cwd=who.tmp, env=who.environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "PLANTED"
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert (ws / ".git" / "config").read_text() == config, err
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert "quarantined" in err and "restored" in err, err
    # Control: the same plant in a plain bwrap with the workspace bound writable stays.
    ctl = who.run(["bwrap", "--ro-bind", "/", "/", "--bind", str(ws), str(ws), "--chdir",
                   str(ws), "--", "/bin/sh", "-c", plant.replace("sleep 60", "true")])
    assert ctl.returncode == 0 and "fsmonitor" in (ws / ".git" / "config").read_text()


def test_a_reused_workspace_whose_corral_was_killed_is_audited_at_the_next_launch(
        who: Identity) -> None:
    """SIGKILL of corral (or the OOM killer) skips the audit of a reused workspace, and
    nothing ever audited what that run planted: the next ``corral run`` with the same
    runs directory audits it now, before its own census takes it in, as agent mode does."""
    ws = who.tmp / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    who.chown(ws)
    hook = ws / ".git" / "hooks" / "pre-commit"
    plant = "printf '#!/bin/sh\\n' > .git/hooks/pre-commit; echo PLANTED; sleep 60"

    def killed(runs: str) -> None:
        proc = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--workspace", str(ws),
                                 "--", "/bin/sh", "-c", plant], cwd=who.tmp,
                                env=who.environ({"CORRAL_RUNS_DIR": runs}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "PLANTED"
        proc.kill()  # no unwinding, no audit
        proc.communicate(timeout=120)
        assert hook.exists()  # the control: killed outright, nothing was audited

    runs = str(who.tmp / "runs")
    killed(runs)
    nxt = who.corral("run", "--workspace", str(ws), "--", "/bin/true",
                     env={"CORRAL_RUNS_DIR": runs})
    assert nxt.returncode == 0, nxt
    assert not hook.exists(), nxt.stderr
    assert "audit was not done" in nxt.stderr, nxt.stderr
    again = who.corral("run", "--workspace", str(ws), "--", "/bin/true",
                       env={"CORRAL_RUNS_DIR": runs})
    assert again.returncode == 0 and "audit was not done" not in again.stderr, again
    # Control: a launch with another runs directory knows nothing of the killed run.
    killed(runs)
    other = who.corral("run", "--workspace", str(ws), "--", "/bin/true",
                       env={"CORRAL_RUNS_DIR": str(who.tmp / "other-runs")})
    assert other.returncode == 0 and hook.exists(), other
