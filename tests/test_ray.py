"""The Ray engine on a real Ray cluster that the test starts: a head and more nodes, all on
127.0.0.1, no dashboard.

Root only, on purpose: Ray is the checkout's optional extra, in a venv the test user cannot
read (CI clones under /root), and a world-readable copy of Ray would cost every CI run a
large install.  What a Ray task runs is corral's one launcher, whose protections are tested as
both identities elsewhere; started by root, each payload runs as nobody, which
:func:`test_jobs_land_on_every_node_and_match_the_local_engine` checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import IS_ROOT, need, processes_with

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def cluster(bwrap: str) -> Iterator[Any]:
    need(IS_ROOT, "the Ray tests run as root (see the module docstring)")
    need(importlib.util.find_spec("ray") is not None, "Ray (corral[ray]) is installed")
    from ray.cluster_utils import Cluster

    node = {"node_ip_address": "127.0.0.1", "num_cpus": 2}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    yield c
    c.shutdown()


def batch(tmp: Path, jobs: list[dict[str, Any]], *args: str, engine: str = "ray",
          wait: bool = True) -> subprocess.Popen[str]:
    path = tmp / f"jobs-{uuid.uuid4().hex[:6]}.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    out = tmp / (path.stem + ".out")
    cmd = [sys.executable, "-m", "corral", "batch", str(path), "-o", str(out), "--quiet",
           "--runs-dir", str(tmp / "runs"), "--engine", engine, *args]
    with open(tmp / (path.stem + ".err"), "w") as err:
        proc = subprocess.Popen(cmd, stderr=err, text=True, cwd=tmp)
    proc.out = out  # type: ignore[attr-defined]
    if wait:
        proc.wait(timeout=600)
    return proc


def errors(proc: subprocess.Popen[str]) -> str:
    return proc.out.with_suffix(".err").read_text()[-3000:]  # type: ignore[attr-defined]


def read(proc: subprocess.Popen[str]) -> dict[str, dict[str, Any]]:
    lines = proc.out.read_text().splitlines()  # type: ignore[attr-defined]
    got = [json.loads(line) for line in lines]
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)), "each job has exactly one result"
    return {r["id"]: r for r in got}


def listening_on_loopback_only() -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ray_lines = [line for line in out.splitlines()
                 if any(n in line for n in ("raylet", "gcs_server", "ray::"))]
    assert ray_lines, "the cluster listens somewhere"
    hosts = [(line.split()[3].rsplit(":", 1)[0].strip("[]"), line) for line in ray_lines]
    return [line for host, line in hosts if host not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]


def test_jobs_land_on_every_node_and_match_the_local_engine(cluster: Any, tmp_path: Path
                                                             ) -> None:
    jobs = [{"id": str(i), "command": ["/bin/sh", "-c", f"sleep 0.3; echo {i}; id -u"]}
            for i in range(16)]
    jobs += [{"id": "c", "code": "#include <stdio.h>\nint main(){puts(\"c\");return 4;}",
              "language": "c"}, {"id": "bad", "code": "x", "language": "cobol"}]
    ray_proc = batch(tmp_path, jobs, "--address", cluster.address)
    local_proc = batch(tmp_path, jobs, engine="local")
    assert ray_proc.returncode == 0 and local_proc.returncode == 0, errors(ray_proc)
    on_ray, local = read(ray_proc), read(local_proc)
    assert len({r["node"] for r in on_ray.values() if r["id"] != "bad"}) == 2, "both nodes"
    assert on_ray["0"]["run"]["stdout"].split()[1] != "0", "payloads never run as root"

    def same(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["status"], r["exit_code"], r["run"] and r["run"]["stdout"], r["error"])

    assert {k: same(r) for k, r in on_ray.items()} == {k: same(r) for k, r in local.items()}
    assert listening_on_loopback_only() == []
    assert not any((tmp_path / "runs").iterdir()), "nothing left behind on any node"


def _running_on(node: Any, marker: str) -> bool:
    """Whether a process with ``marker`` in its command line descends from ``node``'s raylet."""
    raylet = node.all_processes["raylet"][0].process.pid
    for pid in processes_with(marker):
        while pid > 1:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                break
            if pid == raylet:
                return True
    return False


def kill_a_node_mid_batch(cluster: Any, tmp: Path, *args: str) -> dict[str, dict[str, Any]]:
    doomed = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=2)
    marker = f"corral-ray-{uuid.uuid4().hex}"
    jobs = [{"id": str(i), "command": ["/bin/sh", "-c", f"sleep 4; echo {i}; : {marker}"]}
            for i in range(12)]
    proc = batch(tmp, jobs, "--address", cluster.address, *args, wait=False)
    try:
        deadline = time.monotonic() + 120
        while not _running_on(doomed, marker):
            assert time.monotonic() < deadline and proc.poll() is None, "a job on the node"
            time.sleep(0.1)
        cluster.remove_node(doomed, allow_graceful=False)
        assert proc.wait(timeout=600) == 0, errors(proc)
    finally:
        proc.kill()
        proc.wait()
    return read(proc)


def test_a_node_killed_mid_batch_loses_no_job(cluster: Any, tmp_path: Path) -> None:
    got = kill_a_node_mid_batch(cluster, tmp_path)
    assert sorted(got, key=int) == [str(i) for i in range(12)]
    assert all(r["status"] == "exited" and r["run"]["stdout"] == f"{k}\n"
               for k, r in got.items()), got
    # The control: without Ray's retries, the jobs that were on the node are lost.
    lost = kill_a_node_mid_batch(cluster, tmp_path, "--retries", "0")
    assert any(r["status"] == "error" and "Ray lost" in r["error"] for r in lost.values())


def test_the_helper_runs_requests_where_ray_puts_them(cluster: Any) -> None:
    """corral.ray from a driver of its own, the way a Ray user calls it."""
    code = """
import os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # stay on loopback, see engines/ray.py
import ray, corral.ray
from corral import RunRequest
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", include_dashboard=False,
         log_to_driver=False)
reqs = [RunRequest(code=f"print({i} * {i})", language="python", id=str(i)) for i in range(6)]
got = {r.id: r.run.stdout for r in corral.ray.map(reqs)}
assert got == {str(i): f"{i * i}\\n".encode() for i in range(6)}, got
one = corral.ray.result(corral.ray.submit(reqs[2]))
assert one.ok and one.node, one
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code, cluster.address], capture_output=True,
                          text=True, timeout=300, env={**os.environ}, check=False)
    # "ok" on a line of its own: Ray may print after it (a raylet's lagging heartbeats on
    # a loaded machine were reported after the driver had finished).
    assert "ok" in proc.stdout.splitlines(), (proc.stdout[-2000:], proc.stderr[-3000:])
