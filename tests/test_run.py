"""``corral run`` end to end: the real bwrap, as root and as an unprivileged user.

Each protection is paired with a negative control that removes it and shows
the same attempt succeeding, so no test can pass vacuously.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import Identity, processes_with, raw_bwrap, raw_bwrap_argv

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("each_init")]


def _ws(who: Identity, name: str = "ws") -> Path:
    ws = who.tmp / name
    ws.mkdir()
    return who.chown(ws)


def test_exit_codes(who: Identity) -> None:
    assert who.corral("run", "--", "/bin/true").returncode == 0
    assert who.corral("run", "--", "/bin/sh", "-c", "exit 3").returncode == 3
    killed = who.corral("run", "--", "/bin/sh", "-c", "kill -9 $$")
    assert killed.returncode == 137
    timed = who.corral("run", "--timeout", "1", "--", "/bin/sleep", "60")
    assert timed.returncode == 124 and "timed out" in timed.stderr
    failed = who.corral("run", "--", "/no/such/command")
    assert failed.returncode == 125


def test_json_result_follows_the_contract(who: Identity) -> None:
    r = who.corral_json("--", "/bin/sh", "-c", "echo out; echo err >&2; echo hi > /work/f; exit 4")
    assert r["_rc"] == 4 and r["exit_code"] == 4 and r["status"] == "exited"
    assert r["stdout"] == "out\n" and r["stderr"] == "err\n" and r["truncated"] is False
    assert r["signal"] is None and r["wall_s"] > 0 and r["denials"] == []
    for key in ("cpu_s", "peak_memory_bytes", "workspace"):
        assert key in r
    assert [c["path"] for c in r["changes"]] == ["f"]
    signaled = who.corral_json("--", "/bin/sh", "-c", "kill -TERM $$")
    assert (signaled["status"], signaled["signal"], signaled["exit_code"]) == ("signaled", 15, 143)


def test_run_record_is_written_beside_the_workspace(who: Identity) -> None:
    r = who.corral_json("--", "/bin/sh", "-c", "echo data > /work/out.txt")
    record = Path(r["record"])
    assert record.parent == Path(r["workspace"]).parent
    import json

    data = json.loads(record.read_text())
    assert data["status"] == "exited" and data["command"][0] == "/bin/sh"
    assert data["changes"][0]["path"] == "out.txt" and data["changes"][0]["size"] == 5


def test_writes_outside_work_fail_and_leave_nothing(who: Identity, bwrap: str) -> None:
    outside = _ws(who, "outside")
    targets = [outside / "x", Path("/usr/corral-x"), Path("/etc/corral-x"), Path("/corral-x"),
               Path("/var/tmp/corral-x")]
    script = "; ".join(f"(echo pwn > {t}) 2>/dev/null && echo WROTE {t}" for t in targets)
    r = who.corral_json("--", "/bin/sh", "-c", script + "; echo ok > /work/inside; echo t > /tmp/t")
    assert "WROTE" not in r["stdout"], r["stdout"]
    assert r["exit_code"] == 0 and (Path(r["workspace"]) / "inside").read_text() == "ok\n"
    for t in targets:
        assert not t.exists(), f"{t} was created on the host"
    # Negative control: with the directory bound writable, the same write lands on the host.
    ctl = raw_bwrap(bwrap, ["--bind", str(outside), str(outside)],
                    ["/bin/sh", "-c", f"echo pwn > {outside}/x"])
    assert ctl.returncode == 0 and (outside / "x").read_text() == "pwn\n"


def test_launcher_environment_is_invisible(who: Identity, bwrap: str) -> None:
    canary = f"CANARY-{uuid.uuid4().hex}"
    probe = ("cat /proc/1/environ /proc/self/environ 2>/dev/null; env; "
             "for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done")
    r = who.corral_json("--", "/bin/sh", "-c", probe, env={"CORRAL_CANARY": canary})
    assert r["exit_code"] == 0 and "HOME=/work" in r["stdout"]
    assert canary not in r["stdout"] + r["stderr"]
    # Negative control: naming the variable passes it in.
    passed = who.corral_json("--env", "CORRAL_CANARY", "--", "/bin/sh", "-c", "env",
                             env={"CORRAL_CANARY": canary})
    assert canary in passed["stdout"]


def test_host_processes_are_invisible(who: Identity, bwrap: str) -> None:
    marker = f"corral-host-{uuid.uuid4().hex}"
    host = subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", marker])
    try:
        scan = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
        r = who.corral_json("--", "/bin/sh", "-c", scan)
        assert r["exit_code"] == 0 and marker not in r["stdout"]
        # Negative control: without a PID namespace the host process shows.
        ctl = raw_bwrap(bwrap, [], ["/bin/sh", "-c", scan])
        assert marker in ctl.stdout
    finally:
        host.kill()
        host.wait()


def test_root_never_writes_as_uid_0(root: Identity, bwrap: str) -> None:
    who = root
    r = who.corral_json("--", "/bin/sh", "-c", "echo x > /work/mine; id -u")
    assert int(r["stdout"]) != 0
    assert (Path(r["workspace"]) / "mine").stat().st_uid != 0
    with_user = who.corral_json("--user", "1234:1234", "--", "/bin/sh", "-c", "id -u; id -g")
    assert with_user["stdout"].split() == ["1234", "1234"]
    # Negative control: bwrap started by root without corral writes as root.
    ctl_dir = _ws(who, "ctl")
    ctl = raw_bwrap(bwrap, ["--bind", str(ctl_dir), "/work"],
                    ["/bin/sh", "-c", "echo x > /work/mine"])
    assert ctl.returncode == 0 and (ctl_dir / "mine").stat().st_uid == 0


PAYLOAD_ESCAPES = r"""
import ctypes, os, sys, time
marker = sys.argv[1]
if os.fork() == 0:                      # a daemon: new session, double fork
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "sleep 300; :", marker])
    os._exit(0)
if os.fork() == 0:                      # a child that clears its parent-death signal
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
    os.execv("/bin/sh", ["sh", "-c", "sleep 300; :", marker])
open("/work/ready", "w").write("1")
time.sleep(300)
"""


def test_timeout_leaves_nothing_running(who: Identity) -> None:
    ws = _ws(who)
    (ws / "escape.py").write_text(PAYLOAD_ESCAPES)
    who.chown(ws)
    marker = f"corral-escape-{uuid.uuid4().hex}"
    proc = subprocess.Popen([*who.prefix(), "-m", "corral", "run", "--timeout", "20",
                             "--workspace", str(ws), "--", "python3", "escape.py", marker],
                            env=who.environ(), cwd=who.tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "ready").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        # The control: while the run lives, both escapees are alive on the host.
        assert len(processes_with(marker)) >= 2
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 124, err
        deadline = time.monotonic() + 30
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(marker) == []
    finally:
        proc.kill()
        proc.wait()


def test_planted_symlinks_cannot_redirect_the_next_launch(who: Identity, bwrap: str) -> None:
    ws = _ws(who)
    victim = _ws(who, "victim")
    (victim / "keep").write_text("host")
    who.chown(victim)
    names = ["tmp", "etc", "proc", "dev", ".corral", "work", "data.txt", "sub"]
    # During bwrap's setup the host's root is at /oldroot: that is where a planted link aims.
    plant = "; ".join(f"ln -s /oldroot{victim} /work/{n}" for n in names)
    assert who.corral("run", "--workspace", str(ws), "--", "/bin/sh", "-c",
                      plant).returncode == 0
    before = sorted((p.name, p.stat().st_mode) for p in victim.iterdir()), victim.stat().st_mode
    data = who.tmp / "data.txt"
    data.write_text("input")
    who.chown(data)
    again = who.corral("run", "--workspace", str(ws), "--input", str(data), "--", "/bin/sh",
                       "-c", "cat /work/data.txt")
    assert again.returncode == 0 and again.stdout == "input"
    after = sorted((p.name, p.stat().st_mode) for p in victim.iterdir()), victim.stat().st_mode
    assert before == after and (victim / "keep").read_text() == "host"
    # Negative control (DESIGN fact 7): a setup operation under the workspace follows the link.
    ctl = raw_bwrap(bwrap, ["--bind", str(ws), "/work", "--dir", "/work/tmp/planted"],
                    ["/bin/true"])
    assert ctl.returncode == 0 and (victim / "planted").is_dir()


def _no_runs(who: Identity) -> bool:
    runs = who.tmp / "runs"
    return not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("args", [
    ["run"],
    ["run", "--"],
    ["run", "--input", "/no/such/input", "--", "/bin/true"],
    ["run", "--input", "/tmp/with\nnewline", "--", "/bin/true"],
    ["run", "--profile", "no-such-profile", "--", "/bin/true"],
    ["run", "--timeout", "soon", "--", "/bin/true"],
    ["run", "--bogus-flag", "--", "/bin/true"],
    ["run", "--workspace", "/", "--", "/bin/true"],
    ["run", "--allow", "everything", "--", "/bin/true"],
])
def test_bad_input_is_one_line_and_exit_125(who: Identity, args: list[str]) -> None:
    r = who.corral(*args)
    assert r.returncode == 125, r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("corral: error: ")
    assert _no_runs(who)


def test_a_verbs_bad_flag_points_to_the_verbs_help(who: Identity) -> None:
    # The verb's parser is named "corral run", not after the whole top-level usage text.
    r = who.corral("run", "--timeout")
    assert r.returncode == 125 and r.stderr.count("\n") == 1, r
    assert r.stderr.endswith("; see 'corral run --help'\n"), r.stderr
    assert who.corral("doctor", "--help").stdout.startswith("usage: corral doctor [-h]")


@pytest.mark.parametrize("profile", [
    "[limits\ntimeout = 1",                     # malformed
    "[limits]\ntimeuot = 1",                   # unknown key
    "[network]\nallow = 'example.com'",        # wrong type
])
def test_bad_profiles_are_refused(who: Identity, profile: str) -> None:
    f = who.tmp / "p.toml"
    f.write_text(profile)
    who.chown(f)
    r = who.corral("run", "--profile", str(f), "--", "/bin/true")
    assert r.returncode == 125 and r.stderr.count("\n") == 1 and _no_runs(who)
    if "timeuot" in profile:
        assert "did you mean 'timeout'" in r.stderr


def test_python_and_node_scripts_just_work(who: Identity) -> None:
    script = who.tmp / "hello.py"
    script.write_text("import sys, json; print(json.dumps({'ok': True, 'v': sys.version_info[0]}))")
    who.chown(script)
    r = who.corral_json("--input", str(script), "--", "python3", "hello.py")
    assert r["exit_code"] == 0 and r["stdout"].strip() == '{"ok": true, "v": 3}', r
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    js = who.tmp / "hello.js"
    js.write_text("console.log(JSON.stringify({ok: true, n: 1 + 1}))")
    who.chown(js)
    r = who.corral_json("--input", str(js), "--", "node", "hello.js")
    assert r["exit_code"] == 0 and r["stdout"].strip() == '{"ok":true,"n":2}', r


def test_huge_output_is_cut_without_deadlock(who: Identity) -> None:
    r = who.corral_json("--", "/bin/sh", "-c", "head -c 200000000 /dev/zero; echo done >&2")
    assert r["truncated"] is True and r["status"] == "output-limit"
    assert len(r["stdout"]) == 8 << 20 and r["exit_code"] == 137


def test_dry_run_prints_the_sandbox_and_starts_nothing(who: Identity) -> None:
    r = who.corral("run", "--dry-run", "--", "/bin/true")
    assert r.returncode == 0 and _no_runs(who)
    lines = r.stdout.splitlines()
    assert "  --clearenv" in lines and any(line.startswith("  --bind-fd ") for line in lines)
    assert any("--unshare" in line for line in lines)


def test_no_stray_descriptors_reach_the_payload(who: Identity) -> None:
    r = who.corral_json("--", "/bin/sh", "-c", "ls /proc/self/fd")
    # 0, 1, 2 and the descriptor ls opened to list the directory.
    assert r["stdout"].split() == ["0", "1", "2", "3"]


def test_stdio_passes_through_without_json(who: Identity) -> None:
    r = who.corral("run", "--", "/bin/sh", "-c", "echo to-out; echo to-err >&2; cat",
                   input=b"from-stdin\n")
    assert r.stdout == "to-out\nfrom-stdin\n" and r.stderr == "to-err\n"


def test_api_runs_with_defaults() -> None:
    import corral

    result = corral.run(["/bin/true"])
    assert result.exit_code == 0 and result.status == "exited" and result.ok
    out = corral.run(["/bin/sh", "-c", "cat"], stdin=b"abc")
    assert out.stdout == b"abc"
    if os.geteuid() == 0:
        assert os.stat(result.workspace).st_uid != 0


def test_set_id_programs_do_not_survive_the_run(who: Identity) -> None:
    r = who.corral_json("--", "/bin/sh", "-c",
                        "cp /bin/true /work/suid && chmod 6755 /work/suid 2>&1; "
                        "stat -c %a /work/suid")
    if r["stdout"].strip() == "6755":  # the control: inside, the bits were set
        assert (Path(r["workspace"]) / "suid").stat().st_mode & 0o7777 == 0o755
    else:  # the seccomp filter refused chmod with set-ID bits outright: equally safe
        assert "Operation not permitted" in r["stdout"], r
        assert r["stdout"].strip().splitlines()[-1] == "755", r


def test_read_only_extras_under_tmp_are_visible(who: Identity) -> None:
    extra = who.tmp / "extra"
    extra.mkdir()
    (extra / "data.txt").write_text("shared\n")
    extra.chmod(0o755)
    (extra / "data.txt").chmod(0o644)
    r = who.corral_json("--ro", str(extra), "--", "/bin/sh", "-c",
                        f"cat {extra}/data.txt; (echo x > {extra}/data.txt) 2>/dev/null "
                        "&& echo WROTE; true")
    assert r["stdout"] == "shared\n", r
    assert (extra / "data.txt").read_text() == "shared\n"


def test_a_read_only_folder_named_through_a_link_is_shown_with_its_credentials_hidden(
        who: Identity) -> None:
    """``--ro`` of a link to a folder (a dotfiles link, say) crashed the launcher with a
    traceback in the credentials scan; now the folder the link resolves to is scanned and
    bound by descriptor, shown at the path named, with what it holds under a credential's
    name hidden there as in any ``--ro`` folder.  Control: the host reads the credential
    through the same link."""
    real = who.tmp / "dotfiles"
    (real / "notes").mkdir(parents=True)
    (real / "notes" / "todo.txt").write_text("shared\n")
    (real / ".npmrc").write_text("//registry/:_authToken=SECRET-NPM\n")
    link = who.tmp / "extra-link"
    link.symlink_to(real)
    for p in (real, real / "notes"):
        p.chmod(0o755)
    r = who.corral_json("--ro", str(link), "--", "/bin/sh", "-c",
                        f"cat {link}/notes/todo.txt; cat {link}/.npmrc; true")
    assert r["_rc"] == 0 and r["stdout"] == "shared\n", r
    assert "SECRET-NPM" not in r["stdout"] + r["stderr"], r
    assert "SECRET-NPM" in (link / ".npmrc").read_text()  # control


WINCH_PAYLOAD = r"""
import os, signal, sys, time
got = []
signal.signal(signal.SIGWINCH, lambda *_: got.append(1))
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
size = os.get_terminal_size(0)
print("winch" if got else "none", size.columns, size.lines, flush=True)
"""


def _on_a_terminal(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run ``cmd`` on a fresh pseudo-terminal, resize it once it is ready, return its output."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 120
        while b"ready" not in out and time.monotonic() < deadline:
            out += os.read(master, 4096)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
        while b"\n" not in out.split(b"ready", 1)[1].lstrip(b"\r\n") and \
                time.monotonic() < deadline:
            out += os.read(master, 4096)
    except OSError:
        pass
    finally:
        proc.wait(120)
        os.close(master)
    return out.decode(errors="replace")


def test_terminal_resizes_reach_the_payload(who: Identity, bwrap: str) -> None:
    script = who.tmp / "winch.py"
    script.write_text(WINCH_PAYLOAD)
    who.chown(script)
    cmd = [*who.prefix(), "-m", "corral", "run", "--input", str(script), "--", "python3",
           "winch.py", "60"]
    out = _on_a_terminal(cmd, who.environ(), who.tmp)
    assert "winch 132 50" in out, out
    # Control: in a session of its own, without corral passing it on, no resize arrives
    # (the payload gives up after 5 s).
    raw = [*raw_bwrap_argv(bwrap, ["--new-session", "--ro-bind", str(script), "/w.py"],
                           ["/usr/bin/python3", "/w.py", "5"])]
    out = _on_a_terminal(raw, {"PATH": "/usr/bin:/bin"}, who.tmp)
    assert "none 132 50" in out, out


def test_root_mode_leaves_no_capability_in_any_set(root: Identity, bwrap: str) -> None:
    show = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status"
    r = root.corral_json("--", "/bin/sh", "-c", show)
    sets = dict(line.split(":\t") for line in r["stdout"].splitlines())
    assert sets and all(int(v, 16) == 0 for v in sets.values()), sets
    # Control: bwrap started by root keeps what it is told to add, inheritable included.
    ctl = raw_bwrap(bwrap, ["--unshare-pid", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID"],
                    ["/bin/sh", "-c", show])
    assert "CapInh:\t0000000000000000" not in ctl.stdout, ctl.stdout


RAW_IGNORE = r"""
import ctypes, os
def raw_ignore(*numbers):  # the libc refuses 32 and 33, and Python never hears of these
    nr = {"x86_64": 13, "aarch64": 134}[os.uname().machine]  # rt_sigaction
    act = (ctypes.c_ulong * 4)(1)  # SIG_IGN
    for n in numbers:
        assert ctypes.CDLL(None).syscall(nr, n, act, None, 8) == 0
"""

CALLER_SIGNALS = RAW_IGNORE + r"""
import signal, sys
from corral import launch
show = ["/bin/sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status; exit 3"]
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])
raw_ignore(32, 33)  # as a process glibc's posix_spawn started has them
if sys.argv[1] == "cli":  # a parent that ignored SIGCHLD leaves it so across exec
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    from corral.cli import main
    main(["run", "--", *show])
if sys.argv[1] == "off":  # control: bwrap started as the process stands
    launch.default_signals = lambda: lambda: None
    launch.cinit.join_prefix = lambda *a, **k: None
import corral
r = corral.run(show)
print(r.stdout.decode(), end="")
sys.exit(r.exit_code)
"""


def test_the_payload_starts_with_every_signal_at_its_default(who: Identity) -> None:
    """Whatever corral's own process ignores or blocks (SIGHUP under nohup, a mask a
    library caller set, SIGCHLD left ignored by a parent), the payload starts with every
    signal at its default and none blocked, libc's reserved 32 and 33 included (review
    11: glibc's posix_spawn left them ignored).  With SIGCHLD ignored bwrap was reaped
    unseen and the run hung; the command line puts it back and reports the exit status.
    Control: bwrap started as the library caller's process stands gets its ignored
    SIGHUP (the mask the init clears itself)."""
    seen = {}
    for mode in ("on", "cli", "off"):
        r = subprocess.run([*who.prefix(), "-c", CALLER_SIGNALS, mode], env=who.environ(),
                           cwd=who.tmp, capture_output=True, text=True, timeout=120,
                           check=False)
        masks = dict(line.split(":\t") for line in r.stdout.splitlines())
        seen[mode] = (r.returncode, {k: int(v, 16) for k, v in masks.items()}, r.stderr)
    clean = (3, {"SigBlk": 0, "SigIgn": 0}, "")
    assert seen["on"] == clean and seen["cli"] == clean, seen
    # The control: SIGHUP, 32 and 33 reach the payload, besides whatever the test run
    # itself inherited ignored (a job started with & in a script has SIGQUIT so: CI).
    ignored = 1 | 1 << 31 | 1 << 32
    status, masks, _ = seen["off"]
    assert status == 3 and masks["SigBlk"] == 0 and masks["SigIgn"] & ignored == ignored, seen


def test_a_library_caller_that_ignores_sigchld_is_refused(who: Identity) -> None:
    """In a process that ignores SIGCHLD every child is reaped unseen: a failed mke2fs or
    git step would read as a passed one, and bwrap's end was never seen.  SA_NOCLDWAIT
    with the default action does the same without ignoring anything.  corral.run refuses
    before it starts anything; controls: there a child that exits 3 reads as 0 to
    subprocess; with the default corral runs."""
    script = (RAW_IGNORE + "import json, os, signal, subprocess, sys, corral\n"
              "if sys.argv[1] == 'ign': signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
              "if sys.argv[1] == 'raw': raw_ignore(signal.SIGCHLD)\n"
              "if sys.argv[1] == 'nowait':\n"
              "    nr = {'x86_64': 13, 'aarch64': 134}[os.uname().machine]\n"
              "    act = (ctypes.c_ulong * 4)(0, 2)  # SIG_DFL, SA_NOCLDWAIT\n"
              "    assert ctypes.CDLL(None).syscall(nr, signal.SIGCHLD, act, None, 8) == 0\n"
              "    lost = subprocess.run(['/bin/sh', '-c', 'exit 3']).returncode\n"
              "    assert lost == 0, lost  # the harm: a failed step reads as passed\n"
              "runs = os.path.join(os.getcwd(), 'runs-' + sys.argv[1])\n"
              "try:\n"
              "    r = corral.run(['/bin/sh', '-c', 'exit 3'], runs_dir=runs)\n"
              "    print(json.dumps([r.status, r.exit_code]))\n"
              "except corral.CorralError as e:\n"
              "    print(json.dumps(['refused', str(e), os.path.exists(runs)]))\n")
    seen = {}
    for mode in ("ign", "raw", "nowait", "dfl"):
        r = subprocess.run([*who.prefix(), "-c", script, mode], env=who.environ(),
                           cwd=who.tmp, capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 0, r.stderr
        seen[mode] = json.loads(r.stdout)
    for mode in ("ign", "raw"):  # raw: behind Python's back, as a C library may
        assert seen[mode][0] == "refused" and "ignores SIGCHLD" in seen[mode][1], seen
        assert seen[mode][2] is False, seen  # nothing made
    assert seen["nowait"][0] == "refused" and "SA_NOCLDWAIT" in seen["nowait"][1], seen
    assert seen["nowait"][2] is False, seen
    assert seen["dfl"] == ["exited", 3], seen  # the control


def test_a_closed_stderr_gives_the_payload_no_host_handle(who: Identity) -> None:
    """Review 11: with descriptor 2 closed, one of corral's lock folders took its number and
    the payload got it as its stderr, a handle on a host folder.  corral now opens /dev/null
    on a closed 0, 1 or 2 first.  Control: without that, the payload's fd 2 is a folder."""
    show = "readlink /proc/self/fd/2 >&1"
    script = ("import os, sys; from corral import errors; os.close(2)\n"
              "if sys.argv[1] == 'off': errors.standard_streams = lambda: None\n"
              "from corral.cli import main\n"
              f"main(['run', '--', '/bin/sh', '-c', {show!r}])\n")
    seen = {}
    for mode in ("on", "off"):
        r = subprocess.run([*who.prefix(), "-c", script, mode], env=who.environ(), cwd=who.tmp,
                           capture_output=True, text=True, timeout=120, check=False)
        seen[mode] = r.stdout.strip()
    assert seen["on"] == "/dev/null", seen
    assert seen["off"].startswith("/") and seen["off"] != "/dev/null", seen  # the control
