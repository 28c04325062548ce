"""``corral mcp`` end to end: the MCP SDK's own client, over stdio and streamable HTTP, as
root and as the test user, against real ``corral mcp`` processes and the real bwrap.

Each protection runs beside its negative control: the same attempt with the protection
removed (a plain bwrap, a server started with the variable or the name allowed, the
launcher following the link itself) succeeds, so no test passes vacuously.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, processes_with, raw_bwrap
from egress_util import Origin
from mcp_util import (
    call,
    connect,
    eventually,
    http_server,
    refused,
    run,
    sdk,
    servers,
    stdio_client,
    workspaces,
)
from test_resources import BOMB, FORKER, HOG

pytestmark = pytest.mark.sandbox
__all__ = ["sdk"]  # the fixture, imported for pytest

TRANSPORTS = pytest.mark.parametrize("transport", ["stdio", "http"])
PIN = ("--allow-domain", "origin.test", "--resolve", "origin.test:127.0.0.1")
ENV_PROBE = """
import glob, os
seen = []
for f in glob.glob("/proc/[0-9]*/environ"):
    try:
        seen.append(open(f, "rb").read().decode(errors="replace"))
    except OSError:
        pass
print(repr(dict(os.environ)), *seen)
"""
FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] if len(sys.argv) > 1 else {url!r}, timeout=20)
          .read().decode())
except Exception as e:
    print("FAILED", type(e).__name__)
"""


def _outside(who: Identity) -> list[Path]:
    outside = who.tmp / "outside"
    outside.mkdir()
    who.chown(outside)
    return [outside / "x", Path("/usr/corral-mcp-x"), Path("/etc/corral-mcp-x"),
            Path("/corral-mcp-x"), Path("/var/tmp/corral-mcp-x")]


@TRANSPORTS
def test_a_tool_call_runs_inside_the_sandbox(who: Identity, sdk: Path | None, bwrap: str,
                                              transport: str) -> None:
    targets = _outside(who)
    canary = f"CANARY-{uuid.uuid4().hex}"
    writes = "; ".join(f"(echo pwn > {t}) 2>/dev/null && echo WROTE {t}" for t in targets)

    async def main(origin: Origin) -> None:
        async with connect(who, sdk, transport, env={"CORRAL_CANARY": canary}) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"run_code", "run_command", "read_file", "write_file", "list_files"}
            wrote = await call(client, "run_command", {"command": writes + "; echo ok > in"})
            assert wrote["exit_code"] == 0 and "WROTE" not in wrote["stdout"], wrote
            assert [c["path"] for c in wrote["files_changed"]] == ["in"]
            env = await call(client, "run_code", {"language": "python", "code": ENV_PROBE})
            assert "'HOME': '/work'" in env["stdout"] and canary not in env["stdout"]
            net = await call(client, "run_code", {"language": "python", "code": FETCH.format(
                url=f"http://127.0.0.1:{origin.port}/")})
            assert net["stdout"].startswith("FAILED"), net

    with Origin() as origin:
        run(lambda: main(origin))
        assert origin.connections == 0
    for t in targets:
        assert not t.exists(), f"{t} was created on the host"
    # Negative control: a plain bwrap with the directory bound writable writes there.
    ctl = raw_bwrap(bwrap, ["--bind", str(targets[0].parent), str(targets[0].parent)],
                    ["/bin/sh", "-c", f"echo pwn > {targets[0]}"])
    assert ctl.returncode == 0 and targets[0].read_text() == "pwn\n"


def test_the_servers_flags_are_the_only_way_in(who: Identity, sdk: Path | None) -> None:
    """Negative control of the environment and network checks above: a server started with
    the variable passed and the name allowed lets the same calls through."""
    canary = f"CANARY-{uuid.uuid4().hex}"

    async def main(origin: Origin) -> None:
        async with connect(who, sdk, "stdio", "--env", "CORRAL_CANARY", *PIN,
                           env={"CORRAL_CANARY": canary}) as client:
            env = await call(client, "run_code", {"language": "python", "code": ENV_PROBE})
            assert canary in env["stdout"]
            net = await call(client, "run_code", {"language": "python", "code": FETCH.format(
                url=f"http://origin.test:{origin.port}/")})
            assert net["stdout"].startswith("GET / host=origin.test"), net

    with Origin() as origin:
        run(lambda: main(origin))
        assert origin.connections == 1


def test_a_fork_bomb_and_a_memory_hog_are_contained(who: Identity, sdk: Path | None) -> None:
    """The scripts of test_resources.py, sent through the tools: the limits are the server's."""
    marker = f"corral-mcp-bomb-{uuid.uuid4().hex}"
    scripts = {"forker.py": FORKER, "bomb.py": BOMB, "hog.py": HOG}

    async def python(client: Any, *argv: str, **more: Any) -> dict[str, Any]:
        return await call(client, "run_command", {"argv": ["python3", *argv], **more})

    async def tight() -> None:
        async with connect(who, sdk, "stdio", "--pids", "16", "--memory", "64M",
                           "--cpus", "0.5") as client:
            for name, text in scripts.items():
                await call(client, "write_file", {"path": name, "content": text})
            forks = await python(client, "forker.py", "40")
            assert forks["exit_code"] == 0 and int(forks["stdout"]) < 16
            bomb = await python(client, "bomb.py", marker, timeout_s=5)
            assert bomb["status"] == "timeout" and bomb["exit_code"] == 124
            hog = await python(client, "hog.py", "4096")
            assert hog["status"] == "oom" and "survived" not in hog["stdout"]
            assert hog["peak_memory_bytes"] <= 64 << 20

    async def roomy() -> None:  # negative control: the same calls with room enough
        async with connect(who, sdk, "stdio", "--pids", "64", "--memory", "512M") as client:
            for name, text in scripts.items():
                await call(client, "write_file", {"path": name, "content": text})
            assert int((await python(client, "forker.py", "40"))["stdout"]) == 40
            hog = await python(client, "hog.py", "128")
            assert hog["status"] == "exited" and hog["stdout"] == "survived 128\n"

    run(tight)
    assert processes_with(marker) == []
    # The marker is on the bomb's command line, where a survivor would show it: as this does.
    alive = subprocess.Popen(["/bin/sh", "-c", "sleep 60; :", marker])
    try:
        assert eventually(lambda: processes_with(marker) == [alive.pid])
    finally:
        alive.kill()
        alive.wait()
    run(roomy)


@TRANSPORTS
def test_a_sessions_files_persist_between_calls_and_are_gone_after(
        who: Identity, sdk: Path | None, transport: str) -> None:
    async def session(client: Any) -> None:
        await call(client, "write_file", {"path": "data/in.txt", "content": "21\n"})
        code = "print(int(open('data/in.txt').read()) * 2); open('out.txt', 'w').write('x')"
        ran = await call(client, "run_code", {"language": "python", "code": code,
                                              "files": {"lib/helper.py": "K = 1\n"}})
        assert ran["stdout"] == "42\n" and ran["ok"] is True
        assert {c["path"] for c in ran["files_changed"]} == {"out.txt"}
        got = await call(client, "read_file", {"path": "out.txt"})
        assert got == {"path": "out.txt", "size": 1, "content": "x"}
        listed = await call(client, "list_files", {})
        assert {e["path"] for e in listed["entries"]} >= {
            "data", "data/in.txt", "lib", "lib/helper.py", "main.py", "out.txt"}
        again = await call(client, "run_command", {"argv": ["cat", "out.txt", "data/in.txt"]})
        assert again["stdout"] == "x21\n"
        assert len(workspaces(who)) == 1

    if transport == "stdio":
        async def main() -> None:
            async with stdio_client(who, sdk) as client:
                await session(client)
        run(main)
    else:
        with http_server(who, sdk) as server:
            async def main() -> None:
                async with server.client() as client:
                    await session(client)
            run(main)
            # The client ended its session; the server lives on, without the workspace.
            assert eventually(lambda: workspaces(who) == []) and len(servers(who)) == 1
    assert eventually(lambda: servers(who) == [])


def _planted(who: Identity) -> tuple[Path, Path]:
    """A host file and directory the server's identity can read, outside any workspace."""
    host_dir = who.tmp / "host"
    host_dir.mkdir()
    (host_dir / "secret").write_text("HOST-SECRET\n")
    host_dir.chmod(0o777)  # even the payload's own uid could write here, were it reachable
    (host_dir / "secret").chmod(0o666)
    return host_dir / "secret", host_dir


@TRANSPORTS
def test_path_escapes_are_refused(who: Identity, sdk: Path | None, transport: str) -> None:
    secret, host_dir = _planted(who)
    plant = (f"ln -s {secret} link; ln -s {host_dir} dir; mkdir real; ln -s ../.. real/up; "
             "mkfifo pipe")
    attempts: list[tuple[str, dict[str, Any], str]] = [
        ("read_file", {"path": "link"}, "symbolic link"),
        ("read_file", {"path": "dir/secret"}, "symbolic link"),
        ("read_file", {"path": "real/up/x"}, "symbolic link"),
        ("read_file", {"path": "../x"}, "not a plain relative path"),
        ("read_file", {"path": str(secret)}, "is absolute"),
        ("write_file", {"path": "link", "content": "PWNED"}, "symbolic link"),
        ("write_file", {"path": "dir/new", "content": "PWNED"}, "symbolic link"),
        ("write_file", {"path": "a/../../x", "content": "PWNED"}, "not a plain relative"),
        ("list_files", {"path": "dir"}, "symbolic link"),
        ("list_files", {"path": ".."}, "not a plain relative path"),
        ("read_file", {"path": "pipe"}, "it is a fifo"),
        ("write_file", {"path": "pipe", "content": "x"}, "it is a fifo"),
        ("run_code", {"language": "python", "code": "", "files": {"dir/f": "PWNED"}},
         "symbolic link"),
    ]
    naive: list[str] = []

    async def main() -> None:
        async with connect(who, sdk, transport) as client:
            await call(client, "run_command", {"command": plant})
            for tool, args, why in attempts:
                reason = await refused(client, tool, args)
                assert why in reason, (tool, args, reason)
            listed = await call(client, "list_files", {})
            kinds = {e["path"]: e["type"] for e in listed["entries"]}
            assert kinds["link"] == kinds["dir"] == kinds["real/up"] == "symlink"
            # Negative control: a launcher that opens the names itself lands on the host.
            ws = workspaces(who)[0]
            naive.append((ws / "link").read_text())
            naive.append((ws / "dir" / "secret").read_text())

    run(main)
    assert naive == ["HOST-SECRET\n", "HOST-SECRET\n"]
    assert secret.read_text() == "HOST-SECRET\n" and sorted(os.listdir(host_dir)) == ["secret"]


def test_bad_arguments_get_a_tool_error_and_the_server_lives_on(who: Identity,
                                                               sdk: Path | None) -> None:
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("no_such_tool", {}, "unknown tool"),
        ("run_code", {"language": "python"}, "needs code"),
        ("run_code", {"language": "cobol", "code": "x"}, "not supported"),
        ("run_code", {"language": "python", "code": "x", "bogus": 1}, "unknown key 'bogus'"),
        ("run_code", {"language": "python", "code": 3}, "must be a string"),
        ("run_code", {"language": "python", "code": "", "timeout_s": -1}, "positive"),
        ("run_code", {"language": "python", "code": "", "timeout_s": "1h"}, "positive"),
        ("run_code", {"language": "python", "code": "", "files": {"main.py": ""}}, "collides"),
        ("run_code", {"language": "python", "code": "", "stdin": {"base64": "%%"}}, "base64"),
        ("run_command", {}, "exactly one of argv and command"),
        ("run_command", {"argv": ["ls"], "command": "ls"}, "exactly one"),
        ("run_command", {"argv": "ls"}, "list of strings"),
        ("run_command", {"argv": ["/no/such/program"]}, "/no/such/program"),
        ("read_file", {}, "needs path"),
        ("read_file", {"path": "nothing-here"}, "no such file"),
        ("write_file", {"path": "f"}, "needs content"),
        ("list_files", {"path": 7}, "non-empty string"),
    ]

    async def main() -> None:
        async with connect(who, sdk, "stdio", "--timeout", "20") as client:
            for tool, args, why in bad:
                reason = await refused(client, tool, args)
                assert why in reason, (tool, args, reason)
            # The server is fine, and a timeout above its own is lowered to it ...
            capped = await call(client, "run_command", {"argv": ["true"], "timeout_s": 3600})
            assert capped["ok"] and capped["timeout_s"] == 20
            # ... while one below it holds (the negative control: asking does change it).
            short = await call(client, "run_command", {"argv": ["sleep", "30"],
                                                       "timeout_s": 1})
            assert short["status"] == "timeout" and short["timeout_s"] == 1

    run(main)


def test_the_disk_limit_holds_for_the_whole_session(who: Identity, sdk: Path | None) -> None:
    chunk = {"base64": __import__("base64").b64encode(b"\0" * (700 << 10)).decode()}

    async def tight() -> None:
        async with stdio_client(who, sdk, "--disk", "1M") as client:
            await call(client, "write_file", {"path": "a", "content": chunk})
            reason = await refused(client, "write_file", {"path": "b", "content": chunk})
            assert "disk limit" in reason
            grown = await call(client, "run_command", {
                "command": "head -c 700000 /dev/zero > c"})
            assert not grown["ok"], grown
            ws = workspaces(who)[0]
            used = sum(p.stat().st_blocks * 512 for p in ws.rglob("*"))
            assert used <= (1 << 20) + (64 << 10), used

    async def roomy() -> None:  # negative control: the same writes where they fit
        async with stdio_client(who, sdk, "--disk", "8M") as client:
            for name in ("a", "b"):
                await call(client, "write_file", {"path": name, "content": chunk})
            assert (await call(client, "run_command", {
                "command": "head -c 700000 /dev/zero > c"}))["ok"]

    run(tight)
    run(roomy)


def test_a_workspace_corral_made_may_hold_what_its_payload_wrote(who: Identity,
                                                                 sdk: Path | None) -> None:
    """A folder named like credentials (.ssh) in a workspace corral made came from its own
    payload: the session goes on, as a compile-then-run request does.  The check still
    refuses such a directory when the user names it with --workspace (the control)."""
    async def main() -> None:
        async with stdio_client(who, sdk) as client:
            await call(client, "run_command", {"command": "mkdir .ssh && echo k > .ssh/config"})
            again = await call(client, "run_command", {"argv": ["cat", ".ssh/config"]})
            assert again["stdout"] == "k\n"
            compiled = await call(client, "run_code", {"language": "c",
                                                       "code": "int main(void){return 0;}"})
            assert compiled["ok"], compiled

    run(main)
    mine = who.tmp / "project"
    (mine / ".ssh").mkdir(parents=True)
    who.chown(mine)
    named = who.corral("run", "--workspace", str(mine), "--", "/bin/true")
    assert named.returncode == 125 and "holds credentials (.ssh)" in named.stderr
