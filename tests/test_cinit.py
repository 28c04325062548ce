"""The compiled init (corral.cinit, src/corral/init.c): which init a run gets, its config,
and that it fails closed on what it does not understand.

The protections the init sets up are tested against both inits by the kernel-layer,
seccomp, probe, resource, terminal and run suites (the ``each_init`` fixture)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import Identity, need
from corral import api, cinit, egress
from corral.bwrap import CINIT_PATH, INIT_PATH, Sandbox, build_ops, command, render
from corral.errors import HostError, UsageError
from corral.launch import Numbering
from corral.policy import Network, Policy

BASE = Sandbox(argv=("/bin/true",), init_python="/usr/bin/python3", init_source=b"# init",
               init_config={}, root_mode=False, uid=1000, gid=1000, disable_userns=True,
               mounts=(), init_binary="/opt/corral/init.bin")


def test_the_compiled_init_replaces_the_interpreter_and_its_file() -> None:
    words = render(build_ops(BASE), Numbering(first=5))
    at = words.index(CINIT_PATH)
    assert words[at - 2:at + 1] == ["--ro-bind-fd", "5", CINIT_PATH]
    assert INIT_PATH not in words
    assert command(BASE, 9) == [CINIT_PATH, "9", "/bin/true"]


def test_egress_is_served_by_the_compiled_init_too() -> None:
    """The bridge's descriptor and every address it listens on, the proxy port first."""
    rules = egress.compile_rules(Network(allow=("example.test", "127.0.0.1:11434", "[::1]:8080")))
    sb = egress.attach(BASE, egress.plan_bridge(rules, fd=7))
    assert command(sb, 9)[0] == CINIT_PATH
    assert cinit.encode(sb.init_config).split(b"\0")[:-1] == [
        b"bridge_fd=7", b"bridge_batch=64", b"listen=3128:127.0.0.1", b"listen=11434:127.0.0.1",
        b"listen=8080:::1"]


def test_encode_writes_every_setting_as_records() -> None:
    config = {"status_fd": 4, "stderr_fd": 5, "tty": None, "uid": 65534, "gid": 65534,
              "pid": 2, "cwd": "/work", "rlimits": {"nofile": [1024, 1024], "core": [0, 0]},
              "landlock": {"rules": [["/work", 7], ["/a:b", 2]], "min_abi": 1,
                           "best_effort": False, "scope": True},
              "expect_mounts": [["/w/.git", "hide", 1, 2], ["/w/x", "bind", 3, 4]],
              "payload_seccomp": "00" * 8, "env": [["PATH", "/usr/bin"], ["A", "b=c"]]}
    assert cinit.encode(config).split(b"\0") == [
        b"status_fd=4", b"stderr_fd=5", b"uid=65534", b"gid=65534", b"pid=2", b"cwd=/work",
        b"rlimit=nofile:1024:1024", b"rlimit=core:0:0", b"landlock=1:0:1", b"rule=7:/work",
        b"rule=2:/a:b", b"mount=1:1:2:/w/.git", b"mount=0:3:4:/w/x", b"seccomp=" + b"00" * 8,
        b"env=PATH=/usr/bin", b"env=A=b=c", b""]


def test_encode_refuses_a_setting_the_compiled_init_lacks() -> None:
    with pytest.raises(ValueError, match="bridge_source"):
        cinit.encode({"bridge_source": "x"})


def test_encode_refuses_a_nul_that_would_start_a_record() -> None:
    """A NUL in a value ended its record there: ``x\0uid=0`` set the payload's uid to 0."""
    with pytest.raises(ValueError, match="NUL"):
        cinit.encode({"env": [("A", "x\0uid=0\0gid=0")]})
    assert cinit.encode({"env": [("A", "x uid=0")]}) == b"env=A=x uid=0\0"  # control


def test_a_variable_with_a_nul_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """``corral.run(env=...)``: the red-team's payload ran as uid 0 through a NUL in a
    variable; now one clear error, and no run directory is made."""
    runs = tmp_path / "runs"
    with pytest.raises(UsageError, match="NUL"):
        api.run(["/bin/true"], env=[("A", "x\0uid=0\0gid=0")], runs_dir=str(runs))
    assert not runs.exists() or not any(runs.iterdir())
    ok = api.run(["/bin/sh", "-c", "echo $A; id -u"], env=[("A", "x uid=0")],
                 runs_dir=str(runs))  # the control: the same variable without the NUL runs
    assert ok.exit_code == 0 and ok.stdout.split()[:3] == [b"x", b"uid=0", str(
        65534 if os.getuid() == 0 else os.getuid()).encode()], ok


def test_choice_follows_corral_init(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    for value, expected in (("", "c"), ("auto", "c"), ("c", "c"), ("python", "python")):
        monkeypatch.setenv("CORRAL_INIT", value)
        assert cinit.choice() == expected
    monkeypatch.setenv("CORRAL_INIT", "fast")
    with pytest.raises(UsageError, match="CORRAL_INIT=fast"):
        cinit.choice()
    # Not built: auto falls back to the Python init, "c" fails closed.
    monkeypatch.setattr(cinit, "BINARY", str(tmp_path / "missing"))
    monkeypatch.setenv("CORRAL_INIT", "auto")
    assert cinit.choice() == "python"
    assert "not built" in cinit.describe()
    monkeypatch.setenv("CORRAL_INIT", "c")
    with pytest.raises(HostError, match="not built"):
        cinit.choice()
    # Bound into every sandbox as it is: a copy anyone else may rewrite is not used; nor
    # one older than its source (init.c changed, make setup not run again).
    copy = tmp_path / "init.bin"
    copy.write_bytes(Path(cinit.SOURCE).with_name("init.bin").read_bytes())
    monkeypatch.setattr(cinit, "BINARY", str(copy))
    copy.chmod(0o755)
    assert cinit.available()  # the control
    for mode in (0o775, 0o757, 0o750, 0o644):
        copy.chmod(mode)
        assert not cinit.available(), oct(mode)
    copy.chmod(0o755)
    os.utime(copy, (0, 0))
    assert not cinit.available()


def _run_init(config: bytes) -> tuple[int, list[dict[str, object]], bytes]:
    """The compiled init started outside any sandbox with ``config``: it must refuse before
    it does anything (it is root here: the checks come before any privileged step)."""
    status_r, status_w = os.pipe()
    cfg_r, cfg_w = os.pipe()
    os.write(cfg_w, config.replace(b"STATUS", str(status_w).encode()))
    os.close(cfg_w)
    proc = subprocess.run([cinit.BINARY, str(cfg_r), "/bin/echo", "ran"], pass_fds=(cfg_r,
                          status_w), capture_output=True, timeout=60, check=False)
    os.close(cfg_r)
    os.close(status_w)
    with os.fdopen(status_r, "rb") as f:
        events = [json.loads(line) for line in f.read().splitlines()]
    return proc.returncode, events, proc.stdout


@pytest.mark.parametrize("record", [b"bogus=1", b"uid=x", b"rule=7", b"mount=1:2:/x",
                                    b"rlimit=stack:1:1", b"seccomp=abc", b"no-equals",
                                    b"env=NOVALUE", b"cwd=/\0cwd=/tmp", b"pid=2\0pid=-1"])
def test_the_compiled_init_refuses_what_it_does_not_understand(record: bytes) -> None:
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    code, events, out = _run_init(b"status_fd=STATUS\0" + record + b"\0")
    assert code == 125 and out == b"", events
    assert [e["event"] for e in events] == ["error"], events


def test_the_compiled_init_control_runs_a_good_config() -> None:
    """The negative control of the test above: the same start with a config it knows.
    (Outside a sandbox, as this test's own user: no uid drop, no checks of PID 2.)"""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    code, events, out = _run_init(b"status_fd=STATUS\0cwd=/\0")
    assert code == 0 and out == b"ran\n", events
    assert [e["event"] for e in events] == ["started", "exited"], events


def test_a_run_records_which_init_it_got(who: Identity, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    for value, expected in (("", "c"), ("python", "python")):
        monkeypatch.setenv("CORRAL_INIT", value)
        r = who.corral_json("--", "/bin/true")
        assert r["_rc"] == 0, r
        record = json.loads(Path(r["record"]).read_text())
        assert record["init"] == expected, record


def test_asked_for_and_not_built_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.setattr(cinit, "BINARY", str(tmp_path / "missing"))
    monkeypatch.setenv("CORRAL_INIT", "c")
    runs = tmp_path / "runs"
    with pytest.raises(HostError, match="compiled init is not built"):
        api.run(["/bin/true"], Policy(), runs_dir=str(runs))
    assert not runs.exists() or not list(runs.iterdir())  # nothing was created
    monkeypatch.setenv("CORRAL_INIT", "auto")  # the explicit fallback: the Python init
    r = api.run(["/bin/true"], Policy(), runs_dir=str(runs))
    assert r.ok and json.loads(Path(r.record).read_text())["init"] == "python", r


def test_the_joiner_starts_nothing_outside_the_cgroup(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled init's --join mode (cinit.join_prefix): a move that fails
    stops before the command; the control, with the cgroup in place, runs it inside."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    need(os.geteuid() == 0, "root creates cgroups without delegation (the user's runs "
                            "join through it in test_resources, under each_init)")
    from corral import host
    from corral.cgroups import RunCgroup
    from corral.enforce import check
    from corral.policy import Limits

    monkeypatch.setenv("CORRAL_INIT", "c")
    plan = check(Policy(limits=Limits(pids=64)), host.detect())
    marker = tmp_path / "ran"
    cmd = ["/bin/sh", "-c", f"cat /proc/self/cgroup > {marker}"]
    for present in (False, True):
        cg = RunCgroup(plan, f"joiner-test-{os.getpid()}-{present}")
        cg.create()
        try:
            if not present:
                for d in cg.unique:
                    os.rmdir(d)
            prefix = cinit.join_prefix(cinit.BINARY, cg.join_files(), [])
            assert prefix is not None
            proc = subprocess.Popen([*prefix, *cmd], stderr=subprocess.PIPE)
            _, err = proc.communicate(timeout=60)
        finally:
            cg.close()
        if present:
            assert proc.returncode == 0, err
            assert cg.run_id in marker.read_text()
        else:
            assert proc.returncode == 125 and b"corral-join: cannot enter" in err, err
            assert not marker.exists()


def test_the_joiner_makes_the_child_mounts_or_nothing_starts(who: Identity,
                                                             readable_src: Path) -> None:
    """--join's mount options (ChildMounts.joiner_args: a private namespace, a user
    namespace of its own for a plain user, a bounded devpts) as root and as the user; a
    step that fails stops before the command (the control of the success above it)."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    userns = [] if who.is_root else ["--userns", str(who.uid), str(who.gid)]
    show = ["--", "/bin/sh", "-c", "echo ran; grep ' /dev/pts ' /proc/self/mountinfo"]
    for options, ok in ((["newinstance,ptmxmode=0666,mode=0620,max=2"], True),
                        (["newinstance,max=many"], False)):
        binary = readable_src / "corral" / "init.bin"  # CI's checkout may be unreadable
        r = who.run([str(binary), "--join", *userns, "--slave", "--devpts", *options, *show])
        if ok:
            assert r.returncode == 0 and "max=2" in r.stdout, r
        else:
            assert r.returncode == 125 and "ran" not in r.stdout, r
            assert r.stderr.startswith("corral-join: mount devpts: "), r
    # The host's own /dev/pts is untouched (the mount went into the private namespace).
    assert "max=2" not in Path("/proc/self/mountinfo").read_text()


def test_without_a_compiler_the_build_says_so_and_runs_fall_back(tmp_path: Path) -> None:
    """scripts/build-init with no C compiler: a note, success, no binary (so `make setup`
    goes on, and cinit.available() is False: runs use inner.py, and say so in the record,
    as test_asked_for_and_not_built_fails_closed shows).  Control: with cc it builds."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "build-init"
    sources = [str(Path(cinit.SOURCE).with_name(n)) for n in
               ("init.c", "init_config.c", "init_bridge.c", "init_join.c")]
    out = tmp_path / "init.bin"
    r = subprocess.run([str(script), str(out), *sources], env={"PATH": "/usr/bin:/bin",
                       "CC": "no-such-cc"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "no C compiler" in r.stderr and not out.exists(), r
    need(subprocess.run(["sh", "-c", "command -v cc"], capture_output=True).returncode == 0,
         "a C compiler (the control builds the init)")
    r = subprocess.run([str(script), str(out), *sources], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and out.stat().st_mode & 0o111, r


def test_the_init_is_built_with_musl_when_it_is_installed(tmp_path: Path) -> None:
    """scripts/build-init prefers musl-gcc (glibc's static start-up runs CPUID, which traps
    to the hypervisor in a VM: bench/RESULTS.md).  `make setup` installs musl-tools as root,
    so under CI the init every other test runs is the musl build.  Control: with CC named,
    the same script builds with that compiler and glibc, whose marker the binary carries."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "build-init"
    sources = [str(Path(cinit.SOURCE).with_name(n)) for n in
               ("init.c", "init_config.c", "init_bridge.c", "init_join.c")]
    need(subprocess.run(["sh", "-c", "command -v musl-gcc"], capture_output=True).returncode
         == 0, "musl-gcc (apt-get install musl-tools; make setup does it as root)")
    glibc = b"GLIBC_TUNABLES"  # the variable glibc reads at start-up; musl has none
    musl, gnu = tmp_path / "musl.bin", tmp_path / "gnu.bin"
    r = subprocess.run([str(script), str(musl), *sources], env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and musl.stat().st_mode & 0o111, r
    assert glibc not in musl.read_bytes()
    assert glibc not in Path(cinit.BINARY).read_bytes(), "make setup built the glibc init"
    r = subprocess.run([str(script), str(gnu), *sources], env={"PATH": "/usr/bin:/bin",
                       "CC": "cc"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and glibc in gnu.read_bytes(), r


def test_bwrap_gets_only_the_descriptors_it_is_handed(tmp_path: Path) -> None:
    """launch.spawn starts bwrap with posix_spawn through the joiner, whose --keep does what
    subprocess's close_fds and cwd did: a descriptor the launcher's process left
    inheritable (a library's, a caller's) does not reach bwrap, the handed ones do, and the
    directory is /.  Control: the same start without --keep passes the stray one on."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    from corral.launch import spawn

    stray = os.open(tmp_path, os.O_RDONLY)
    os.set_inheritable(stray, True)
    handed_r, handed = os.pipe()  # close-on-exec here, like every descriptor corral makes
    out_r, out = os.pipe()
    show = ["/bin/sh", "-c", "readlink /proc/$$/cwd; ls /proc/$$/fd"]
    seen = {}
    try:
        for keep in (True, False):
            prefix = cinit.join_prefix(cinit.BINARY, [], [], [handed] if keep else None)
            assert prefix is not None
            child = spawn([*prefix, *show], stdin=None, stdout=out, stderr=out, keep=[handed],
                          joiner=True)
            assert child._popen is None  # posix_spawn, not subprocess
            assert child.wait(60) == 0
            text = os.read(out_r, 65536).decode().split()
            seen[keep] = (text[0], {int(fd) for fd in text[1:]})
    finally:
        for fd in (stray, handed_r, handed, out_r, out):
            os.close(fd)
    assert seen[True] == ("/", {0, 1, 2, handed}), seen
    assert stray in seen[False][1] and handed in seen[False][1], seen  # the control


def test_the_joiner_refuses_a_descriptor_it_was_not_handed() -> None:
    """A --keep listing a closed descriptor stops before bwrap (which would read another
    descriptor at that number), as does a malformed list."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    closed = os.open("/dev/null", os.O_RDONLY)
    os.close(closed)
    for keep, said in (([closed], b"is not open"), (None, b"bad descriptor list")):
        argv = cinit.join_prefix(cinit.BINARY, [], [], keep)
        assert argv is not None
        if keep is None:
            argv[2:2] = ["--keep", "1,x"]
        r = subprocess.run([*argv, "/bin/echo", "ran"], capture_output=True, timeout=60,
                           check=False)
        assert r.returncode == 125 and b"ran" not in r.stdout and said in r.stderr, r
    r = subprocess.run([*(cinit.join_prefix(cinit.BINARY, [], []) or []), "/bin/echo", "ran"],
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout == b"ran\n", r  # control: nothing to refuse


def _signals(argv: list[str], joiner: bool) -> dict[str, int]:
    """The SigIgn and SigBlk masks of ``argv``'s process, started as corral starts bwrap
    (joiner) or by a bare ``posix_spawn`` (the control)."""
    from corral.launch import spawn

    out_r, out = os.pipe()
    try:
        if joiner:
            prefix = cinit.join_prefix(cinit.BINARY, [], [], [])
            assert prefix is not None
            spawn([*prefix, *argv], stdin=None, stdout=out, stderr=out, keep=[], joiner=True)
        else:
            os.posix_spawn(argv[0], argv, {}, file_actions=[
                (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)])
        os.close(out)
        out = -1
        text = b""  # read to the end: with SIGCHLD ignored here, no status to wait for
        while chunk := os.read(out_r, 65536):
            text += chunk
    finally:
        os.close(out_r)
        if out >= 0:
            os.close(out)
    lines = text.decode().splitlines()
    return {k: int(v, 16) for k, v in (line.split(":\t") for line in lines)}


def test_bwrap_starts_with_every_signal_at_its_default() -> None:
    """The joiner starts bwrap with every signal at its default and none blocked, whatever
    the launcher's process ignores or blocks: exec keeps both, and glibc's posix_spawn
    leaves its internal signals 32 and 33 ignored in the child (review 11).  Control: the
    bare posix_spawn shows them ignored, with the caller's SIGHUP and SIGCHLD, and its
    mask."""
    need(cinit.available(), "corral's compiled init (make setup builds it with cc)")
    reserved = (1 << 31) | (1 << 32)  # bit N-1 is signal N
    argv = ["/bin/grep", "^Sig(Ign|Blk)", "-E", "/proc/self/status"]
    old = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGHUP, signal.SIGCHLD)]
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        joined, bare = _signals(argv, True), _signals(argv, False)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in zip((signal.SIGHUP, signal.SIGCHLD), old, strict=True):
            signal.signal(s, handler)
    assert joined == {"SigBlk": 0, "SigIgn": 0}, joined
    hup_chld = 1 | (1 << (signal.SIGCHLD - 1))
    assert bare["SigIgn"] & (reserved | hup_chld) == reserved | hup_chld, bare  # the control
    assert bare["SigBlk"] == 1 << (signal.SIGUSR1 - 1), bare
