"""RunRequest and RunResult: the one request shape, its strict JSON form, and running it.

The pure part (parsing, validation, round trips) needs no sandbox.  Running requests uses the
real bwrap as root and as the unprivileged test user; every protection of the request path
(fetching back without following links or blocking, caps, removal of what the run left)
has its control: the same thing done naively is fooled.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import Identity
from corral import UsageError
from corral.request import LANGUAGES, RunRequest, decode_bytes, encode_bytes
from corral.result import RunResult

# --- the pure part ------------------------------------------------------------------------


@given(st.binary(max_size=512))
def test_bytes_round_trip_losslessly(data: bytes) -> None:
    encoded = encode_bytes(data)
    assert decode_bytes(json.loads(json.dumps(encoded)), "x") == data
    if isinstance(encoded, str):  # text stays readable
        assert encoded == data.decode("utf-8")


def test_a_full_request_round_trips() -> None:
    data = {
        "id": "job-1", "code": "print(1)", "language": "python",
        "files": {"a/b.txt": "text", "bin": {"base64": "AAEC/w=="}}, "stdin": "in",
        "profile": "python", "limits": {"timeout": 5, "memory": "256M", "fetch": 1024},
        "network": {"allow": ["pypi.org"]}, "env": {"K": "v"}, "fetch": ["out.txt"],
    }
    req = RunRequest.from_json(data)
    assert req.files == (("a/b.txt", b"text"), ("bin", b"\0\1\2\xff"))
    assert req.limits.memory_bytes == 256 << 20 and req.limits.timeout_s == 5.0
    again = RunRequest.from_json(json.loads(json.dumps(req.to_json())))
    assert again == req


@pytest.mark.parametrize(("data", "says"), [
    ({"code": "x", "langauge": "python"}, "did you mean 'language'"),
    ({"code": "x"}, "language None is not supported"),
    ({"code": "x", "language": "cobol"}, "not supported"),
    ({"command": ["/bin/true"], "code": "x", "language": "python"}, "exactly one"),
    ({}, "exactly one"),
    ({"command": []}, "non-empty"),
    ({"command": "ls -l"}, "list of strings"),
    ({"command": ["a\0b"]}, "without NUL"),
    ({"command": ["/bin/true"], "profile": "claude"}, "cannot be requested"),
    ({"command": ["/bin/true"], "profile": "../../etc/x.toml"}, "cannot be requested"),
    ({"command": ["/bin/true"], "files": {"../x": "a"}}, "plain relative path"),
    ({"command": ["/bin/true"], "files": {"/etc/x": "a"}}, "plain relative path"),
    ({"command": ["/bin/true"], "files": {"a//b": "a"}}, "plain relative path"),
    ({"command": ["/bin/true"], "files": {"a": "x", "a/b": "y"}}, "collides"),
    ({"code": "x", "language": "python", "files": {"main.py": "y"}}, "collides"),
    ({"command": ["/bin/true"], "files": {"a": {"base64": "!!"}}}, "base64"),
    ({"command": ["/bin/true"], "files": {"a": 3}}, "not text"),
    ({"command": ["/bin/true"], "fetch": ["../../etc/shadow"]}, "plain relative path"),
    ({"command": ["/bin/true"], "limits": {"timeout": -1}}, "positive"),
    ({"command": ["/bin/true"], "limits": {"timeout": "none"}}, "not a duration"),
    ({"command": ["/bin/true"], "limits": {"memory": "lots"}}, "not a size"),
    ({"command": ["/bin/true"], "limits": {"pids": True}}, "positive integer"),
    ({"command": ["/bin/true"], "limits": {"timout": 1}}, "did you mean 'timeout'"),
    ({"command": ["/bin/true"], "network": {"allow": ["bad name!"]}}, ""),
    ({"command": ["/bin/true"], "env": {"1X": "v"}}, "not valid"),
    ({"command": ["/bin/true"], "id": ""}, "not usable"),
    ({"command": ["/bin/true"], "id": "a\nb"}, "not usable"),
    ([1, 2], "JSON object"),
])
def test_bad_requests_are_refused_with_a_reason(data: Any, says: str) -> None:
    with pytest.raises(UsageError) as e:
        RunRequest.from_json(data)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_results_parse_strictly() -> None:
    good = RunResult.refused("x", "invalid", "because").to_json()
    assert RunResult.from_json(good).to_json() == good
    for bad in ({**good, "extra": 1}, {**good, "status": "fine"}, {**good, "run": {"x": 1}},
                {**good, "id": 3}):
        with pytest.raises(UsageError):
            RunResult.from_json(bad)


def test_languages_cover_the_brief() -> None:
    assert {"python", "nodejs", "bash", "c", "cpp"} <= set(LANGUAGES)
    assert LANGUAGES["c"].compile and LANGUAGES["cpp"].compile


# --- running requests, as root and as the test user -----------------------------------------

RUNNER = """
import json, sys
from corral.execute import run_request
from corral.request import RunRequest
from corral.result import RunResult
keep = sys.argv[1] == "keep"
out = []
for data in json.load(sys.stdin):
    res = run_request(RunRequest.from_json(data), keep=keep)
    assert RunResult.from_json(res.to_json()).to_json() == res.to_json()
    out.append(res.to_json())
print(json.dumps(out))
"""


def run_as(who: Identity, requests: list[dict[str, Any]], keep: bool = False,
           timeout: float = 300) -> list[dict[str, Any]]:
    proc = subprocess.run([*who.prefix(), "-c", RUNNER, "keep" if keep else "drop"],
                          input=json.dumps(requests), env=who.environ(), cwd=who.tmp,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    out: list[dict[str, Any]] = json.loads(proc.stdout)
    return out


def runs_left(who: Identity) -> list[str]:
    runs = who.tmp / "runs"
    return sorted(os.listdir(runs)) if runs.exists() else []


PROGRAMS = {
    "python": "import sys; print(int(sys.stdin.read()) * 2)",
    "nodejs": "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>console.log(2*s))",
    "bash": "read n; echo $((n * 2))",
    "c": "#include <stdio.h>\nint main(){int n;scanf(\"%d\",&n);printf(\"%d\\n\",2*n);}",
    "cpp": "#include <iostream>\nint main(){int n;std::cin>>n;std::cout<<2*n<<std::endl;}",
}


@pytest.mark.sandbox
def test_every_language_runs_and_nothing_is_left(who: Identity) -> None:
    reqs = [{"id": lang, "code": code, "language": lang, "stdin": "21"}
            for lang, code in PROGRAMS.items()]
    results = run_as(who, reqs)
    for res in results:
        assert (res["status"], res["run"]["stdout"]) == ("exited", "42\n"), res
        assert (res["compile"] is not None) == (res["id"] in ("c", "cpp"))
    assert runs_left(who) == []


@pytest.mark.sandbox
def test_compile_has_its_own_timeout_and_status(who: Identity) -> None:
    slow = {"id": "slow", "code": PROGRAMS["cpp"], "language": "cpp", "stdin": "1",
            "limits": {"compile_timeout": "1ms", "timeout": 30}}
    broken = {"id": "broken", "code": "int main() { nope; }", "language": "c"}
    fine = {**slow, "id": "fine", "limits": {"timeout": 30}}
    got = {r["id"]: r for r in run_as(who, [slow, broken, fine])}
    assert got["slow"]["status"] == "compile-failed" and got["slow"]["run"] is None
    assert got["slow"]["compile"]["status"] == "timeout"
    assert got["broken"]["status"] == "compile-failed"
    assert "nope" in got["broken"]["compile"]["stderr"]
    # The control: the same program with the default compile timeout compiles and runs.
    assert got["fine"]["status"] == "exited" and got["fine"]["run"]["stdout"] == "2\n"


@pytest.mark.sandbox
def test_files_go_in_and_come_back_capped(who: Identity) -> None:
    code = ("import os; print(open('data/in.txt').read());"
            "open('out.bin','wb').write(bytes(range(256)));"
            "open('big','wb').write(b'x' * 3_000_000); os.mkfifo('fifo')")
    req = {"id": "f", "code": code, "language": "python", "files": {"data/in.txt": "hello"},
           "fetch": ["out.bin", "big", "fifo", "absent"], "limits": {"fetch": "1M"}}
    [res] = run_as(who, [req])
    assert res["run"]["stdout"] == "hello\n"
    assert decode_bytes(res["files"]["out.bin"], "out") == bytes(range(256))
    assert "big" not in res["files"] and "fetch limit" in res["unfetched"]["big"]
    assert "fifo" in res["unfetched"] and "absent" in res["unfetched"]
    # The control: within the limit, the big file does come back.
    [res] = run_as(who, [{**req, "limits": {"fetch": "4M"}}])
    assert len(res["files"]["big"]) == 3_000_000


@pytest.mark.sandbox
def test_fetch_never_follows_a_link_out(who: Identity) -> None:
    secret = who.tmp / "secret.txt"
    secret.write_text("HOST-SECRET")
    secret.chmod(0o644)  # readable by anyone on the host: only the link stands in the way
    code = (f"import os; os.symlink({str(secret)!r}, 'out'); os.mkdir('d');"
            f"os.symlink({str(who.tmp)!r}, 'd/up')")
    req = {"id": "l", "code": code, "language": "python", "fetch": ["out", "d/up/secret.txt"]}
    [res] = run_as(who, [req], keep=True)
    assert res["files"] == {} and set(res["unfetched"]) == {"out", "d/up/secret.txt"}
    # The control: reading the same names by path, as a naive fetch would, gets the secret.
    ws = Path(res["run"]["workspace"])
    assert (ws / "out").read_text() == "HOST-SECRET"
    assert (ws / "d/up/secret.txt").read_text() == "HOST-SECRET"


HOSTILE_TREE = """
import os
os.makedirs('locked/inner'); open('locked/inner/f', 'w').write('x')
os.chmod('locked/inner', 0); os.chmod('locked', 0o500)
os.symlink(VICTIM, 'link'); os.symlink(VICTIM + '/keep', 'filelink')
os.chdir('/work')
d = '/work/deep'
os.mkdir(d); os.chdir(d)
for i in range(100):
    os.mkdir('d'); os.chdir('d')
open('bottom', 'w').write('b')
"""


@pytest.mark.sandbox
def test_removal_of_a_hostile_workspace_stays_inside(who: Identity) -> None:
    victim = who.tmp / "victim"
    victim.mkdir()
    (victim / "keep").write_text("host file")
    who.chown(victim)
    victim.chmod(0o777)  # the payload could write here if a removal followed the link
    (victim / "keep").chmod(0o666)
    code = HOSTILE_TREE.replace("VICTIM", repr(str(victim)))
    [res] = run_as(who, [{"id": "h", "code": code, "language": "python"}])
    assert res["status"] == "exited", res
    assert runs_left(who) == [], "the request's run directories were removed"
    assert (victim / "keep").read_text() == "host file"
    # The control: the same tree, kept, really holds the links out and the locked directory.
    [kept] = run_as(who, [{"id": "h", "code": code, "language": "python"}], keep=True)
    ws = Path(kept["run"]["workspace"])
    assert os.readlink(ws / "link") == str(victim) and (ws / "link" / "keep").exists()
    assert (ws / "deep" / "/".join(["d"] * 100) / "bottom").exists()  # deeper than REMOVE_DEPTH


@pytest.mark.sandbox
def test_corral_run_takes_a_request(tmp_path: Path, bwrap: str) -> None:
    import corral

    os.environ.setdefault("CORRAL_RUNS_DIR", str(tmp_path / "runs"))
    res = corral.run(corral.RunRequest(code="print('hi')", language="python", id="api"))
    assert isinstance(res, corral.RunResult) and res.ok and res.run is not None
    assert res.run.stdout == b"hi\n" and res.id == "api"
    bad = corral.run(corral.RunRequest(command=("/no/such/program",)))
    assert bad.status == "invalid" and bad.error and "not found" in bad.error
    with pytest.raises(UsageError):  # a policy beside a request would be silently ignored
        corral.run(corral.RunRequest(command=("/bin/true",)), corral.Policy())  # type: ignore[call-overload]


@pytest.mark.sandbox
def test_limits_of_a_request_hold(who: Identity) -> None:
    t0 = time.monotonic()
    reqs = [{"id": "t", "command": ["/bin/sleep", "60"], "limits": {"timeout": 1}},
            {"id": "o", "command": ["/bin/sh", "-c", "head -c 5000000 /dev/zero"],
             "limits": {"output": "1M"}}]
    got = {r["id"]: r for r in run_as(who, reqs)}
    assert got["t"]["status"] == "timeout" and time.monotonic() - t0 < 50
    assert got["o"]["status"] == "output-limit" and got["o"]["run"]["truncated"]
    assert len(got["o"]["run"]["stdout"]) == 1 << 20


REMOVE = """
import json, os, shutil, sys
from corral import fsops
top = sys.argv[1]
def build(root):
    os.makedirs(root + '/locked/inner')
    open(root + '/locked/inner/f', 'w').write('x')
    os.symlink(sys.argv[2], root + '/link')
    os.chmod(root + '/locked/inner', 0); os.chmod(root + '/locked', 0o500)
    d = root + '/deep'
    for i in range(150):
        d += '/d'
    os.makedirs(d)
build(top + '/naive'); build(top + '/corral')
shutil.rmtree(top + '/naive', ignore_errors=True)
fsops.remove_tree(top + '/corral')
print(json.dumps({"naive": os.path.lexists(top + '/naive'),
                  "corral": os.path.lexists(top + '/corral')}))
"""


@pytest.mark.sandbox
def test_remove_tree_empties_what_the_payload_locked(who: Identity) -> None:
    victim = who.tmp / "victim"
    victim.mkdir()
    (victim / "keep").write_text("host file")
    who.chown(victim)
    work = who.tmp / "trees"
    work.mkdir()
    who.chown(work)
    proc = subprocess.run([*who.prefix(), "-c", REMOVE, str(work), str(victim)],
                          env=who.environ(), cwd=who.tmp, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    gone = json.loads(proc.stdout)
    assert gone["corral"] is False and (victim / "keep").read_text() == "host file"
    if not who.is_root:  # the control: a plain removal cannot enter what was locked
        assert gone["naive"] is True
