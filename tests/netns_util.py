"""Scripts run inside a user and network namespace that the test creates, as root or as the
test user.  Every address used there is one the test assigned inside that namespace, so no
traffic can reach anything else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import SRC, SYSTEM_PYTHON, Identity, need

HERE = Path(__file__).resolve().parent

# A second network namespace, nested in the first and joined to it by a veth pair: an
# origin there is a "remote" host at a public-looking address that is not the proxy's own.
REMOTE = r'''
import os, socket, subprocess, sys, time

REMOTE_CODE = r"""
import os, socket, sys, threading, time
addr = sys.argv[1]
parent = os.getppid()
def orphaned():  # never outlive the script that started us, however it ends
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)
threading.Thread(target=orphaned, daemon=True).start()
ls = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
for _ in range(600):
    try:
        ls.bind((addr, 0))
        break
    except OSError:
        time.sleep(0.05)
ls.listen(64)
print(ls.getsockname()[1], flush=True)
count = 0
while True:
    c, _ = ls.accept()
    count += 1
    c.recv(65536)
    body = b"remote %d\n" % count
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
              % (len(body), body))
    c.close()
"""


def sh(command):
    subprocess.run(["sh", "-c", command], check=True)


def start_remote(outer, inner):
    """An HTTP origin at ``inner`` in a nested namespace; ``outer`` is our end of the link."""
    proc = subprocess.Popen(["unshare", "--net", sys.executable, "-c", REMOTE_CODE, inner],
                            stdout=subprocess.PIPE)
    time.sleep(0.2)
    sh("ip link add v0 type veth peer name v1")
    sh(f"ip link set v1 netns {proc.pid}")
    sh(f"ip addr add {outer}/24 dev v0 && ip link set v0 up")
    sh(f"nsenter -t {proc.pid} -n sh -c 'ip link set lo up; ip addr add {inner}/24 dev v1; "
       f"ip link set v1 up'")
    return proc, int(proc.stdout.readline())
'''


def run_in_netns(who: Identity, script: str, setup: str = "ip link set lo up", *,
                 mount: bool = False, timeout: float = 180
                 ) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python, dedented) as ``who`` in new user and network namespaces (and
    a mount namespace when ``mount``), after the shell commands ``setup``.  The script can
    import corral and egress_util; it finds REMOTE's helpers in ``netns_prelude``."""
    need(shutil.which("unshare") is not None and shutil.which("ip") is not None,
         "unshare and ip are installed on this kind of machine")
    for name in ("egress_util.py",):
        shutil.copy(HERE / name, who.tmp / name)
    (who.tmp / "netns_prelude.py").write_text(REMOTE)
    path = who.tmp / "netns_script.py"
    path.write_text(textwrap.dedent(script))
    for p in who.tmp.iterdir():
        if p.is_file():
            p.chmod(0o644)
    python = SYSTEM_PYTHON if who.src is not None else sys.executable
    src = who.src if who.src is not None else SRC
    flags = ["--map-root-user", "--net", *(["--mount"] if mount else [])]
    cmd = ["unshare", *flags, "sh", "-c", setup + ' && exec "$@"', "sh", python, str(path)]
    proc = who.run(cmd, env={"PYTHONPATH": f"{src}:{who.tmp}"}, timeout=timeout)
    need(proc.returncode == 0 or "Traceback" in proc.stderr,
         f"cannot create namespaces here: {proc.stderr.strip()}")
    return proc
