"""Everyday work keeps running under the seccomp allow-list, as root and as the test user.

Interpreters, their runtimes' threads and processes, package managers, git,
compilers and test runners with a loopback server: each is run for real in
``corral run``.  There is nothing to control here: these check that the filter
lets work through, where the other kernel tests check what it refuses.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from conftest import CI, Identity, need
from layer_tools import give

pytestmark = pytest.mark.sandbox

SCRIPT_PY = """\
import asyncio, multiprocessing, subprocess, threading

async def child():
    proc = await asyncio.create_subprocess_exec("/bin/echo", "async", stdout=subprocess.PIPE)
    return (await proc.communicate())[0].decode().strip()

def square(x):
    return x * x

if __name__ == "__main__":
    results = []
    threads = [threading.Thread(target=results.append, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with multiprocessing.Pool(2) as pool:
        print(asyncio.run(child()), sum(pool.map(square, range(4))), sum(results))
"""
SCRIPT_JS = """\
const out = require('child_process').execFileSync('/bin/echo', ['child']).toString().trim();
const { Worker } = require('worker_threads');
const net = require('net');
const worker = new Worker('require("worker_threads").parentPort.postMessage(6 * 7)',
                          { eval: true });
worker.on('message', answer => {
  const server = net.createServer(c => c.end('tcp')).listen(0, '127.0.0.1', () => {
    net.connect(server.address().port, '127.0.0.1')
      .on('data', d => { console.log(out, answer, d.toString()); server.close(); });
  });
});
"""


def _node() -> bool:
    if shutil.which("node") is None:
        need(not CI, "node is not installed")
        return False
    return True


def test_python_and_node_scripts_run_under_their_profiles(who: Identity) -> None:
    py = give(who, "work.py", SCRIPT_PY)
    r = who.corral_json("--input", str(py), "--", "python3", "work.py")
    assert r["exit_code"] == 0 and r["stdout"] == "async 14 28\n", r
    if not _node():
        return
    js = give(who, "work.js", SCRIPT_JS)
    r = who.corral_json("--input", str(js), "--", "node", "work.js")
    assert r["exit_code"] == 0 and r["stdout"] == "child 42 tcp\n", r


def _wheel(folder: Path) -> Path:
    """A tiny pure-Python project, packed as a wheel by hand (no build tools, no network)."""
    files = {
        "corral_demo/__init__.py": "def hello():\n    return 'hello from a wheel'\n",
        "corral_demo-0.1.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: corral-demo\nVersion: 0.1\n",
        "corral_demo-0.1.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: corral-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files["corral_demo-0.1.dist-info/RECORD"] = "\n".join(
        [*record, "corral_demo-0.1.dist-info/RECORD,,"]) + "\n"
    path = folder / "corral_demo-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    path.chmod(0o644)
    return path


def test_pip_installs_a_local_wheel_into_a_venv(who: Identity) -> None:
    wheel = who.chown(_wheel(who.tmp))
    steps = ("python3 -m venv /work/venv && "
             "/work/venv/bin/pip install --no-index --quiet /work/corral_demo-0.1-py3-none-any.whl"
             " && /work/venv/bin/python -c 'import corral_demo; print(corral_demo.hello())'")
    r = who.corral_json("--profile", "python", "--input", str(wheel), "--", "/bin/sh", "-c", steps)
    assert r["exit_code"] == 0 and r["stdout"].endswith("hello from a wheel\n"), r


CPP = """\
#include <atomic>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <vector>

int main() {
    std::atomic<int> sum{0};
    std::vector<std::thread> pool;
    for (int i = 1; i <= 4; ++i) pool.emplace_back([&sum, i] { sum += i; });
    for (auto &t : pool) t.join();
    std::ofstream("out.txt") << sum << "\\n";
    try {
        throw std::runtime_error("caught");
    } catch (const std::exception &e) {
        std::cout << "C++ " << e.what() << " " << sum << std::endl;
    }
}
"""


def test_git_commit_and_gcc_and_gpp_work(who: Identity) -> None:
    for tool in ("gcc", "g++", "git"):
        need(shutil.which(tool) is not None, f"{tool} is needed")
    c = give(who, "hello.c", '#include <stdio.h>\nint main(void) '
                             '{ puts("compiled and ran"); return 0; }\n')
    cpp = give(who, "threads.cpp", CPP)
    steps = ("git init -q repo && cd repo && echo data > f && git add f && "
             "git -c user.name=corral -c user.email=corral@example.invalid commit -qm first && "
             "git log --format=%s && cd /work && gcc -O1 -o hello hello.c && ./hello && "
             "g++ -O1 -pthread -o threads threads.cpp && ./threads && cat out.txt")
    r = who.corral_json("--input", str(c), "--input", str(cpp), "--", "/bin/sh", "-c", steps)
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "first\ncompiled and ran\nC++ caught 10\n10\n", r


UNITTEST = """\
import http.server, threading, unittest, urllib.request

class Loopback(unittest.TestCase):
    def test_a_server_on_loopback(self):
        server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/test_loop.py"
            self.assertIn(b"Loopback", urllib.request.urlopen(url, timeout=30).read())
        finally:
            server.shutdown()
"""
NODE_TEST = """\
const test = require('node:test');
const assert = require('node:assert');
const http = require('node:http');

test('a server on loopback', async () => {
  const server = http.createServer((req, res) => res.end('pong')).listen(0, '127.0.0.1');
  await new Promise(resolve => server.on('listening', resolve));
  const body = await new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: server.address().port }, res => {
      let data = '';
      res.on('data', chunk => { data += chunk; });
      res.on('end', () => resolve(data));
    }).on('error', reject);
  });
  server.close();
  assert.strictEqual(body, 'pong');
});
"""


def test_test_runners_with_a_loopback_server(who: Identity) -> None:
    py = give(who, "test_loop.py", UNITTEST)
    r = who.corral_json("--input", str(py), "--", "python3", "-m", "unittest", "-q",
                        "test_loop")
    assert r["exit_code"] == 0 and "OK" in r["stderr"], r
    if not _node():
        return
    js = give(who, "loop.test.js", NODE_TEST)
    r = who.corral_json("--input", str(js), "--", "node", "--test", "loop.test.js")
    assert r["exit_code"] == 0 and "# pass 1" in r["stdout"], r


INTERFACES_PY = "import socket; print([name for _, name in socket.if_nameindex()])"
INTERFACES_JS = "console.log(Object.keys(require('os').networkInterfaces()).join())"
LO_DOWN = """\
import socket, struct
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
link = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 1, 0, 1)  # lo: clear IFF_UP
s.send(struct.pack("=IHHII", 16 + len(link), 16, 1 | 4, 1, 0) + link)  # RTM_NEWLINK, ACK
print(struct.unpack_from("=i", s.recv(4096), 16)[0])  # NLMSG_ERROR's error
"""


def test_programs_can_list_the_sandboxs_interfaces(who: Identity) -> None:
    # getifaddrs and if_nameindex ask netlink's routing protocol; dev servers list addresses
    r = who.corral_json("--", "python3", "-c", INTERFACES_PY)
    assert r["exit_code"] == 0 and r["stdout"] == "['lo']\n", r
    # It only reads: without CAP_NET_ADMIN the kernel refuses every change.
    r = who.corral_json("--", "python3", "-c", LO_DOWN)
    assert r["exit_code"] == 0 and r["stdout"] == f"{-errno.EPERM}\n", r
    if not _node():
        return
    r = who.corral_json("--", "node", "-e", INTERFACES_JS)
    assert r["exit_code"] == 0 and r["stdout"] == "lo\n", r
