"""Egress end to end: the real bwrap, bridge and proxy, as root and as the test user.

Origins listen on the host's 127.0.0.1 and are reached through names pinned
with ``--resolve``; nothing here sends traffic anywhere else.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import Identity, need, raw_bwrap
from egress_util import Origin, StaticOrigin, package_index, write_script

pytestmark = pytest.mark.sandbox

PIN = ("--allow-domain", "origin.test", "--resolve", "origin.test:127.0.0.1")


def test_common_clients_reach_a_pinned_origin_and_others_are_denied(who: Identity) -> None:
    need(shutil.which("curl") is not None, "curl is not installed")
    urllib = write_script(who, "fetch.py", """
        import sys, urllib.request, urllib.error
        try:
            print(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode(), end="")
        except urllib.error.HTTPError as e:
            print(e.code, e.headers["X-Corral-Denied"], e.read().decode(), end="")
    """)
    with Origin() as origin:
        o = f"origin.test:{origin.port}"
        script = (f"curl -sS http://{o}/plain; curl -sS -p http://{o}/tunnel; "
                  f"curl -sS --socks5-hostname 127.0.0.1:3128 http://{o}/socks; "
                  f"python3 fetch.py http://{o}/urllib; "
                  f"python3 fetch.py http://elsewhere.test:{origin.port}/")
        r = who.corral_json("--input", str(urllib), *PIN, "--", "/bin/sh", "-c", script)
        assert r["exit_code"] == 0, r
        assert r["stdout"].splitlines() == [
            f"GET /plain host={o}", f"GET /tunnel host={o}", f"GET /socks host={o}",
            f"GET /urllib host={o}",
            f"403 not-allowed corral: elsewhere.test:{origin.port} is not in the allow list"]
        assert origin.connections == 4
    assert [(d["host"], d["code"]) for d in r["denials"]] == [("elsewhere.test", "not-allowed")]
    record = json.loads(Path(r["record"]).read_text())
    assert record["denials"] == r["denials"]
    lines = [json.loads(x) for x in Path(record["egress_log"]).read_text().splitlines()]
    assert [x["allowed"] for x in lines] == [True, True, True, True, False]


def test_without_an_allowed_name_there_is_no_proxy_at_all(who: Identity) -> None:
    with Origin() as origin:
        r = who.corral_json("--resolve", "origin.test:127.0.0.1", "--allow-domain",
                            "origin.test", "--deny-domain", "origin.test", "--", "/bin/sh", "-c",
                            f"curl -sS -o /dev/null -w '%{{http_code}}' http://origin.test:"
                            f"{origin.port}/")
        assert r["stdout"] == "403" and origin.connections == 0  # deny wins
        bare = who.corral_json("--", "/bin/sh", "-c", "env | grep -ci proxy; "
                               "curl -sS http://127.0.0.1:3128/ 2>&1; exit 0")
        assert bare["stdout"].startswith("0\n") and "Failed to connect" in bare["stdout"]
        assert origin.connections == 0


def test_pip_installs_from_a_local_index_through_the_proxy(who: Identity) -> None:
    root = package_index(who.tmp / "index")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    pip = ("python3 -m pip install --no-cache-dir --disable-pip-version-check --target "
           "/work/site --trusted-host pypi.test --index-url http://pypi.test:{port}/simple/ "
           "corraltiny && "
           "PYTHONPATH=/work/site python3 -c 'import corraltiny; print(corraltiny.VALUE)'")
    with StaticOrigin(root) as index:
        r = who.corral_json("--allow-domain", "pypi.test", "--resolve", "pypi.test:127.0.0.1",
                            "--timeout", "120", "--", "/bin/sh", "-c",
                            pip.format(port=index.port))
        assert r["exit_code"] == 0 and r["stdout"].strip().endswith("42"), r
        # Control: the same install with pypi.test not allowed fails, and says why.
        denied = who.corral_json("--allow-domain", "other.test", "--timeout", "120", "--",
                                 "/bin/sh", "-c", pip.format(port=index.port))
        assert denied["exit_code"] != 0
        assert {d["host"] for d in denied["denials"]} == {"pypi.test"}


def test_git_and_npm_use_the_proxy_variables(who: Identity) -> None:
    need(shutil.which("git") is not None and shutil.which("npm") is not None,
         "git and npm are installed on this kind of machine")
    root = who.tmp / "srv"
    subprocess.run(["git", "init", "-q", "--bare", str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)
    (root / "registry").mkdir()
    doc = {"name": "corraltiny", "dist-tags": {"latest": "1.0.0"},
           "versions": {"1.0.0": {"name": "corraltiny", "version": "1.0.0"}}}
    (root / "registry" / "corraltiny").write_text(json.dumps(doc))
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    with StaticOrigin(root) as srv:
        base = f"http://origin.test:{srv.port}"
        script = (f"git ls-remote {base}/repo.git >/dev/null && echo git-ok; "
                  f"npm view corraltiny version --registry {base}/registry/ "
                  f"--cache /tmp/npm 2>&1")
        r = who.corral_json(*PIN, "--timeout", "120", "--", "/bin/sh", "-c", script)
        assert r["stdout"].splitlines()[:2] == ["git-ok", "1.0.0"], r
        assert r["denials"] == []


PROBES = r"""
import errno, os, socket, sys
host_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
def attempt(name, fn):
    try:
        fn()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)
attempt("tcp-host-loopback", lambda: socket.create_connection(("127.0.0.1", host_port), 5))
attempt("udp-route", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(
    ("198.51.100.1", 9)))  # a route lookup only: connect() on UDP sends nothing
attempt("udp-send", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b"x", ("127.0.0.1", udp_port)))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("ping", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt("resolv.conf", lambda: open("/etc/resolv.conf").close())
try:
    socket.getaddrinfo("origin.test", 80)
    print("dns ok")
except socket.gaierror:
    print("dns failed")
"""


def test_no_dns_udp_icmp_raw_or_direct_connections(who: Identity, bwrap: str) -> None:
    probe = write_script(who, "probe.py", PROBES)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    with Origin() as origin, udp:
        args = [str(origin.port), str(udp.getsockname()[1])]
        r = who.corral_json("--input", str(probe), *PIN, "--", "python3", "probe.py", *args)
        results = dict(line.split(" ", 1) for line in r["stdout"].splitlines())
        assert results == {"tcp-host-loopback": "ECONNREFUSED", "udp-route": "ENETUNREACH",
                           "udp-send": "ok", "raw": "EPERM", "ping": "EACCES",
                           "resolv.conf": "ENOENT", "dns": "failed"}, r
        with pytest.raises(TimeoutError):
            udp.recv(16)  # the datagram stayed in the sandbox's own namespace
        assert origin.connections == 0
        # Negative control: the same probes in bwrap sharing the host's network, as root.
        ctl = raw_bwrap(bwrap, ["--ro-bind", str(probe), "/probe.py",
                                "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
                                "--ro-bind-try", "/root/.pyenv", "/root/.pyenv"],
                        ["python3", "/probe.py", *args])
        control = dict(line.split(" ", 1) for line in ctl.stdout.splitlines() if " " in line)
        for name in ("tcp-host-loopback", "udp-route", "raw", "resolv.conf"):
            assert control.get(name) == "ok", (name, ctl)
        assert udp.recv(16) == b"x" and origin.connections == 1


def test_the_first_request_never_races_the_bridge(who: Identity) -> None:
    with Origin() as origin:
        for _ in range(3):
            r = who.corral_json(*PIN, "--", "python3", "-c",
                                "import urllib.request as u; print(u.urlopen('http://origin."
                                f"test:{origin.port}/first').status)")
            assert r["stdout"] == "200\n", r
        assert origin.connections == 3


def test_the_payload_holds_no_proxy_descriptor(who: Identity) -> None:
    r = who.corral_json(*PIN, "--", "/bin/sh", "-c", "ls /proc/self/fd")
    assert r["stdout"].split() == ["0", "1", "2", "3"]


def test_a_profile_network_table_works_and_is_validated(who: Identity) -> None:
    with Origin() as origin:
        good = write_script(who, "net.toml", """
            [network]
            allow = ["origin.test"]
            resolve = { "origin.test" = "127.0.0.1" }
        """)
        r = who.corral_json("--profile", str(good), "--", "/bin/sh", "-c",
                            f"curl -sS http://origin.test:{origin.port}/p")
        assert r["stdout"] == f"GET /p host=origin.test:{origin.port}\n", r
    for bad in ('allow = ["http://x.test/"]', 'resolve = { "x.test" = "x.test" }',
                'allow = ["x.test"]\nresolve = ["x.test:127.0.0.1"]', 'alow = ["x.test"]'):
        f = write_script(who, "bad.toml", "[network]\n" + bad + "\n")
        out = who.corral("run", "--profile", str(f), "--", "/bin/true")
        assert out.returncode == 125 and out.stderr.count("\n") == 1, (bad, out.stderr)


@pytest.mark.parametrize("flags", [
    ["--allow-domain", "http://origin.test/"],
    ["--allow-domain", "*"],
    ["--allow-domain", "origin.test:0"],
    ["--deny-domain", "a b"],
    ["--resolve", "origin.test"],
    ["--resolve", "origin.test:127.1", "--allow-domain", "origin.test"],
    ["--resolve", "origin.test:127.0.0.1"],  # pinned but never allowed
    ["--allow-domain", "*.test", "--deny-domain", "stra\u00dfe.test"],  # IDNA 2003 != 2008
    ["--allow-domain", "fa\u00df.de"],
    ["--allow-domain", "127.0.0.1:3128"],  # the bridge's own port inside
])
def test_bad_network_flags_are_one_line_and_exit_125(who: Identity, flags: list[str]) -> None:
    r = who.corral("run", *flags, "--", "/bin/true", env={"LANG": "C.UTF-8"})
    assert r.returncode == 125 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("corral: error: ")
    runs = who.tmp / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_idna_2008_names_work_for_both_identities(who: Identity) -> None:
    """The IDNA 2008 form of a name runs (as the plain user too, from the readable copy with
    idna beside it); its ambiguous spelling is refused (above)."""
    r = who.corral_json("--allow-domain", "*.test", "--deny-domain", "xn--strae-oqa.test",
                        "--allow-domain", "b\u00fccher.test", "--", "/bin/sh", "-c",
                        "curl -sS -o /dev/null -w '%{http_code}' http://xn--strae-oqa.test/")
    assert r["stdout"] == "403" and r["denials"][0]["code"] == "denied", r


MANY_TUNNELS = r"""
import json, os, socket, sys
import corral
from corral.policy import Network, Policy
port = int(sys.argv[1])
before = sorted(os.listdir("/proc/self/fd"))
payload = r'''
import socket, sys
port = int(sys.argv[1])
socks = []
for i in range(500):
    s = socket.create_connection(("127.0.0.1", 3128), 60)
    s.sendall(b"CONNECT origin.test:%d HTTP/1.1\r\n\r\n" % port)
    socks.append(s)
ok = 0
for s in socks:
    if s.recv(64).startswith(b"HTTP/1.1 200"):
        ok += 1
for i, s in enumerate(socks):
    s.sendall(b"GET /%d HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n" % i)
served = sum(b"GET /%d host=o" % i in b"".join(iter(lambda: s.recv(65536), b""))
             for i, s in enumerate(socks))
print(ok, served)
'''
policy = Policy(network=Network(allow=("origin.test",), resolve=(("origin.test", "127.0.0.1"),)))
result = corral.run(["python3", "-c", payload, str(port)], policy)
after = sorted(os.listdir("/proc/self/fd"))
print(json.dumps({"stdout": result.stdout.decode(), "stderr": result.stderr.decode()[-2000:],
                  "before": before, "after": after}))
"""


def test_500_concurrent_tunnels_through_one_run_then_no_descriptors(who: Identity) -> None:
    script = write_script(who, "many.py", MANY_TUNNELS)
    with Origin() as origin:
        proc = subprocess.run([*who.prefix(), str(script), str(origin.port)],
                              env=who.environ(), cwd=who.tmp, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["stdout"].split() == ["500", "500"], out
        assert origin.connections == 500
    assert out["after"] == out["before"]
