"""``corral probe``: the catalogue, the battery, and every check against its negative control.

Every built-in profile must pass every check.

No check may pass vacuously: each must FAIL under a launcher that lacks the
protection it tests.  As root, ``none`` (no sandbox) is that launcher for every
check except CRAFTED ones, which get a launcher built for them; as the
unprivileged user, ``none`` again, except for checks the host's own
permissions already settle for a plain user (HOST_SETTLED).  The seed's
``naive`` line must show the seed's three failures.
"""

from __future__ import annotations

import ast
import contextlib
import ipaddress
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity
from corral.errors import UsageError
from corral.probe import CATALOGUE, launcher_for, markdown, select
from corral.probe.canaries import LEFTOVER_DIRS, processes_with
from corral.probe.checks import CATEGORIES
from corral.probe.report import CheckResult, Report, render_text
from corral.profiles import builtin_profiles

ROOT = Path(__file__).resolve().parent.parent
BATTERY = ROOT / "src" / "corral" / "probe" / "battery.py"
IDS = {c.id for c in CATALOGUE}

CRAFTED = {  # checks that `none` does not exercise here -> a launcher lacking the protection
    "secrets-pid1-environ": "bwrap --dev-bind / / --unshare-pid --proc /proc",
    "lifecycle-exit-status": "sh -c '\"$@\"; exit 0' sh",
    "launch-project-writable": "bwrap --ro-bind / / --proc /proc --dev /dev",
}
HOST_SETTLED = {  # a plain user is stopped by the host's own permissions, sandbox or not
    "writes-etc", "writes-usr-local-bin", "writes-root-dir", "secrets-etc-shadow",
    "secrets-root-home", "secrets-root-listing", "network-raw-socket", "network-packet-socket",
    "privilege-host-uid", "privilege-capabilities", "privilege-mount", "privilege-bpf",
}
SEED_FAILURES = {"secrets-fake-creds", "network-tcp-loopback", "launch-from-home"}
# ... and what a plain bwrap line does not stop either (issue 15's datagram socket pair)
NAIVE_FAILURES = {*SEED_FAILURES, "network-unix-datagram", "network-unix-daemon"}

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("each_init")]


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host_denies(check: str, is_root: bool) -> str | None:
    """Why this host stops ``check``'s attempt by itself, without a sandbox (None: it does
    not), so that no sandbox can be shown to lack the protection here."""
    if check == "network-vsock":
        try:
            socket.socket(40, socket.SOCK_STREAM).close()
        except OSError:
            return "this kernel offers no AF_VSOCK"
    if check == "network-tcp6-loopback":
        try:
            socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        except OSError:
            return "no IPv6 loopback here"
    if is_root:
        return None
    if check == "privilege-tiocsti" and _read("/proc/sys/dev/tty/legacy_tiocsti") == "0":
        return "dev.tty.legacy_tiocsti=0 denies TIOCSTI to every plain user"
    if check == "privilege-io-uring" and _read("/proc/sys/kernel/io_uring_disabled") not in (
            "", "0"):
        return "kernel.io_uring_disabled denies io_uring to plain users"
    if check == "privilege-perf-event" and int(
            _read("/proc/sys/kernel/perf_event_paranoid") or "2") > 2:
        return "kernel.perf_event_paranoid > 2"
    if check == "privilege-userns" and _read("/proc/sys/user/max_user_namespaces") == "0":
        return "user.max_user_namespaces=0"
    if check == "resources-open-files" and resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096:
        return "the hard RLIMIT_NOFILE is below the probe's bound"
    if check == "resources-shm" and os.statvfs("/dev/shm").f_blocks * os.statvfs(
            "/dev/shm").f_frsize < 1 << 30:
        return "the host's /dev/shm is smaller than the probe's bound"
    return None


# --- the catalogue, the battery, the report (no sandbox) ------------------------------------

def test_catalogue_is_a_table_of_unique_checks() -> None:
    assert len(CATALOGUE) >= 60
    assert len(IDS) == len(CATALOGUE)
    assert {c.category for c in CATALOGUE} == set(CATEGORIES)
    for c in CATALOGUE:
        assert c.id.startswith(c.category + "-"), c.id
        assert c.attempted and c.expected and c.why, c.id
        assert c.attempts or c.id in ("lifecycle-exit-status", "lifecycle-timeout-tree"), c.id
    assert set(CRAFTED) <= IDS and HOST_SETTLED <= IDS and NAIVE_FAILURES <= IDS


def test_every_check_is_documented() -> None:
    text = (ROOT / "docs" / "probe.md").read_text()
    generated = text.split("<!-- checks:begin -->\n")[1].split("<!-- checks:end -->")[0]
    assert generated == markdown(CATALOGUE), "regenerate the list in docs/probe.md"


def test_battery_is_standalone_and_never_copies_content(tmp_path: Path) -> None:
    tree = ast.parse(BATTERY.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= sys.stdlib_module_names | {"__future__"}, imported
    secret = tmp_path / "secret"
    token = "CANARY-abc-0123456789abcdef"
    secret.write_text(f"password=hunter2 {token} CANARY-abc-short\n")
    config = {"prefix": "CANARY-abc-", "exit": 3, "attempts": [
        {"id": "r", "op": "read", "path": str(secret)}, {"id": "s", "op": "status"},
        {"id": "x", "op": "read", "path": str(tmp_path / "missing")}]}
    out = subprocess.run(["/usr/bin/python3", "-I", str(BATTERY), "main", json.dumps(config)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 3, out.stderr
    records = [json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()]
    results = {r["id"]: r for r in records if "ok" in r}
    assert results["r"]["found"] == [token] and "hunter2" not in out.stdout
    assert results["s"]["ok"] is True and "CapEff" in results["s"]["fields"]
    assert results["x"]["ok"] is False and results["x"]["detail"].startswith("ENOENT")


def test_report_puts_failures_first_and_ends_with_one_verdict() -> None:
    checks = (CheckResult("writes-a", "writes", "try a", "no", "refused", True),
              CheckResult("writes-b", "writes", "try b", "no", "it worked", False))
    report = Report("test", checks, 1.0, "run1")
    data = report.to_json()
    assert data["verdict"] == "fail" and data["failed"] == 1 and data["run"] == "run1"
    assert set(data["checks"][0]) == {"id", "category", "attempted", "expected", "observed",
                                      "passed"}
    lines = render_text(report).splitlines()
    assert max(len(line) for line in render_text(report, 30).splitlines()[:-1]) <= 30
    assert lines.index(next(line for line in lines if "writes-b" in line)) < lines.index(
        next(line for line in lines if "writes-a" in line))
    assert lines[-1].startswith("verdict: FAIL: 1 of 2 checks failed (writes-b)")
    assert Report("t", checks[:1], 1.0).to_json()["verdict"] == "pass"


def test_launchers_and_selection() -> None:
    from corral.probe.canaries import Plant
    from corral.probe.launchers import LaunchSpec

    plant = Plant("r", "/var/tmp/x", {}, {}, None, 1)
    spec = LaunchSpec("main", "main", "/proj", (), 1.0)
    naive = launcher_for("naive", None).argv(spec, plant, "{}")
    assert naive[:8] == ["bwrap", "--ro-bind", "/", "/", "--bind", "/proj", "/proj",
                         "--unshare-pid"]
    assert naive[-4:] == ["python3", "corral-probe-battery.py", "main", "{}"]
    assert launcher_for("none", None).argv(spec, plant, "{}")[0] == "python3"
    assert launcher_for("firejail --quiet", None).argv(spec, plant, "{}")[:2] == [
        "firejail", "--quiet"]
    corral = launcher_for(None, "python").argv(spec, plant, "{}")
    assert corral[2:5] == ["corral", "run", "--profile"] and "--input" in corral
    # Where the profile forbids unix sockets the datagram canary is made visible.
    assert corral[corral.index("--ro") + 1] == "/var/tmp/x/log"
    assert "--ro" not in launcher_for(None, "shell").argv(spec, plant, "{}")
    assert "--home" in launcher_for(None, None).argv(spec, plant, "{}")
    for bad in (("naive", "claude"), ("'unclosed", None), ("", None)):
        with pytest.raises(UsageError):
            launcher_for(*bad)
    assert {c.category for c in select(["network"])} == {"network"}
    with pytest.raises(UsageError, match="did you mean 'secrets-aws'"):
        select(["secrets-awss"])


# --- the probe against real sandboxes ---------------------------------------------------------

class OpenProxy:
    """An HTTP CONNECT proxy that tunnels anywhere on loopback and nowhere else."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    @staticmethod
    def _tunnel(client: socket.socket) -> None:
        with client, contextlib.suppress(OSError, ValueError):
            client.settimeout(5)
            head = client.recv(4096).decode()
            host, _, port = head.split()[1].rpartition(":")
            address = "127.0.0.1" if host == "localhost" else \
                str(ipaddress.IPv4Address(int(host))) if host.isdigit() else host
            if not ipaddress.ip_address(address).is_loopback:  # never beyond loopback
                client.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                return
            with socket.create_connection((address, int(port)), timeout=5) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(client.recv(4096))

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def proxy() -> Iterator[OpenProxy]:
    p = OpenProxy()
    yield p
    p.close()


def probe(who: Identity, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = who.corral("probe", "--json", *args, env=env, timeout=600)
    assert r.returncode in (0, 1), r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    assert (r.returncode == 0) == (data["verdict"] == "pass")
    data["failed_ids"] = {c["id"] for c in data["checks"] if not c["passed"]}
    data["observed"] = {c["id"]: c["observed"] for c in data["checks"]}
    return data


def assert_cleaned_up(run: str) -> None:
    """No path, process or keyring key of the run is left (keys go once unreferenced)."""
    tag = f"corral-probe-{run}"
    for where in LEFTOVER_DIRS:
        with contextlib.suppress(OSError):
            assert not [n for n in os.listdir(where) if n.startswith(tag)], where
    assert processes_with(tag) == [] and processes_with(f"CANARY-{run}-") == []
    deadline = time.monotonic() + 10
    while tag in Path("/proc/keys").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tag not in Path("/proc/keys").read_text()


@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_builtin_profile_passes_every_check(who: Identity, profile: str) -> None:
    data = probe(who, "--profile", profile)
    failed = data["failed_ids"]
    assert not failed, {i: data["observed"][i] for i in failed}
    assert_cleaned_up(data["run"])


def test_no_sandbox_fails_every_check_it_can(who: Identity, proxy: OpenProxy) -> None:
    """The negative control of the whole catalogue, and cleanup after the worst launcher."""
    data = probe(who, "--launcher", "none", env={"HTTPS_PROXY": proxy.url})
    exempt = set(CRAFTED) | (set() if who.is_root else HOST_SETTLED)
    exempt |= {c for c in IDS if host_denies(c, who.is_root)}
    passed = (IDS - exempt) - data["failed_ids"]
    assert not passed, {i: data["observed"][i] for i in passed}
    # Each failed because the attempt worked, not because it could not be made.
    unmade = ("not attempted", "the battery did not start", "battery error", "not run")
    vacuous = {i: o for i, o in data["observed"].items()
               if i in data["failed_ids"] and o.startswith(unmade)}
    assert not vacuous, vacuous
    assert_cleaned_up(data["run"])


@pytest.mark.parametrize("check", sorted(CRAFTED))
def test_crafted_controls_fail_their_check(who: Identity, check: str) -> None:
    data = probe(who, "--check", check, "--launcher", CRAFTED[check])
    assert data["failed_ids"] == {check}, data["observed"]


def test_naive_sandbox_shows_the_seeds_failures(who: Identity) -> None:
    data = probe(who, "--launcher", "naive", "--check", "secrets", "--check", "network",
                 "--check", "launch")
    assert data["failed_ids"] >= NAIVE_FAILURES, data["observed"]
    assert "holding the canary" in data["observed"]["secrets-fake-creds"]
    assert "~/.bashrc: its content changed" in data["observed"]["launch-from-home"]


def test_probe_errors_are_one_line(who: Identity) -> None:
    for args in (["--launcher", "naive", "--profile", "claude"], ["--check", "nosuch"],
                 ["--profile", "nosuch"]):
        r = who.corral("probe", *args)
        assert r.returncode == 125 and r.stderr.startswith("corral: error: "), r.stderr
        assert r.stderr.count("\n") == 1
