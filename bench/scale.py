"""corral at scale: engines, the server and Ray, against a raw-bwrap pool on the same cores.

Every figure is measured in this one run, as a ratio against the floor: a pool of threads
each running the seed document's plain bwrap line (no corral at all) on the same work.

* local engine: ``LocalPool(N).map(requests)`` against the raw pool with N threads, for
  ``/bin/true`` and ``python3 -c 'print(1)'``, N = 1, 2, 4, 8;
* ``corral serve``: latency (p50, p99) and throughput of ``POST /run_code`` from 16 client
  threads, against the same requests run through the API (``run_request``) by as many
  threads as the server has workers;
* Ray: ``corral.ray.map`` on a local cluster of one node, then two (both on this machine's
  cores: the second node adds scheduling, not CPU).

Run as root from the checkout: ``.venv/bin/python bench/scale.py [--write] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section

from corral.engines.local import LocalPool, default_workers
from corral.execute import run_request
from corral.request import RunRequest

SEED_BASE = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink",
             "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev",
             "/dev", "--unshare-all", "--die-with-parent", "--new-session", "--"]
WORKERS = (1, 2, 4, 8)
WORK = {"/bin/true": ["/bin/true"], "python3 -c 'print(1)'": ["/usr/bin/python3", "-c",
                                                               "print(1)"]}


def rate(jobs: int, seconds: float) -> float:
    return jobs / seconds if seconds > 0 else 0.0


def raw_pool(cmd: list[str], workers: int, jobs: int) -> float:
    bwrap = shutil.which("bwrap") or "bwrap"

    def one(_: int) -> None:
        subprocess.run([bwrap, *SEED_BASE, *cmd], stdout=subprocess.DEVNULL, check=True)

    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(jobs)))
    return rate(jobs, time.perf_counter() - t)


def engine_pool(cmd: list[str], workers: int, jobs: int, runs: str) -> float:
    requests = (RunRequest(command=tuple(cmd), id=str(i)) for i in range(jobs))
    t = time.perf_counter()
    results = list(LocalPool(workers, runs_dir=runs).map(requests))
    elapsed = time.perf_counter() - t
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
    return rate(jobs, elapsed)


def table(head: list[str], rows: Iterable[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def local_section(jobs: int, runs: str) -> str:
    rows = []
    for name, cmd in WORK.items():
        for workers in WORKERS:
            raw = raw_pool(cmd, workers, jobs)
            ours = engine_pool(cmd, workers, jobs, runs)
            rows.append([f"`{name}`", str(workers), f"{raw:.0f}", f"{ours:.0f}",
                         f"{ours / raw:.2f}x"])
    return ("### Local engine against a raw-bwrap pool (runs/s)\n\n"
            + table(["work", "workers", "raw bwrap pool", "corral LocalPool", "ratio"], rows))


def layer_section(jobs: int, runs: str) -> str:
    """What the request layer adds to one launch: staging, its own run directory, removal."""
    import corral

    def median_ms(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(jobs // 4):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000

    request = RunRequest(command=("/bin/true",))
    rows = []
    for _ in range(2):  # interleaved, so that a change of load hits both alike
        api = median_ms(lambda: corral.run(["/bin/true"], runs_dir=runs))
        ours = median_ms(lambda: run_request(request, runs_dir=runs))
        rows.append([f"{api:.1f}", f"{ours:.1f}", f"{ours - api:+.1f}"])
    return ("### What the request layer adds to one run (`/bin/true`, median ms, one at a "
            "time)\n\n" + table(["corral.run(argv)", "run_request(RunRequest)", "difference"],
                                  rows))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def post(url: str, body: bytes) -> float:
    t = time.perf_counter()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        data = json.loads(resp.read())
    assert data["status"] == "Success", data
    return time.perf_counter() - t


def timed_pool(fn: Callable[[int], float], threads: int, jobs: int) -> tuple[list[float], float]:
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        lat = list(pool.map(fn, range(jobs)))
    return lat, time.perf_counter() - t


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def through_server(workers: int, clients: int, jobs: int, runs: str
                   ) -> tuple[list[float], float]:
    """Latencies and wall time of ``jobs`` POST /run_code from ``clients`` threads."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "corral", "serve", "--port", str(port),
                               "--workers", str(workers), "--runs-dir", runs],
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/run_code"
    body = json.dumps({"code": "print(1)", "language": "python"}).encode()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                post(url, body)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        return timed_pool(lambda _: post(url, body), clients, jobs)
    finally:
        server.terminate()
        server.wait(60)


def serve_section(jobs: int, runs: str) -> str:
    clients = 16
    request = RunRequest(code="print(1)", language="python")

    def direct(_: int) -> float:
        t = time.perf_counter()
        assert run_request(request, runs_dir=runs).ok
        return time.perf_counter() - t

    rows = []
    for workers in (2, 4):
        lat, wall = through_server(workers, clients, jobs, runs)
        api_lat, api_wall = timed_pool(direct, workers, jobs)
        for path, conc, ls, w in (
                ("`corral serve`, POST /run_code", f"{clients} clients", lat, wall),
                ("the API, run_request", "as many threads", api_lat, api_wall)):
            rows.append([path, str(workers), conc, f"{pct(ls, 50) * 1000:.0f}",
                         f"{pct(ls, 99) * 1000:.0f}", f"{rate(jobs, w):.1f}"])
        rows.append(["server / API", str(workers), "", "", "",
                     f"{rate(jobs, wall) / rate(jobs, api_wall):.2f}x"])
    note = ("\nThe server's latency includes the time a request waits for a worker "
            f"({clients} clients share the workers); the API's does not.\n")
    return ("### `corral serve` against the same work through the API (python `print(1)`)\n\n"
            + table(["path", "workers", "clients", "p50 ms", "p99 ms", "runs/s"], rows) + note)


def ray_section(jobs: int, runs: str) -> str:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only; see engines/ray.py
    import ray
    from ray.cluster_utils import Cluster

    import corral.ray

    node = {"node_ip_address": "127.0.0.1", "num_cpus": os.cpu_count() or 2}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    rows = []
    try:
        for nodes in (1, 2):
            if nodes == 2:
                cluster.add_node(**node)
            ray.init(address=cluster.address, _node_ip_address="127.0.0.1",
                     include_dashboard=False, log_to_driver=False)
            warm = [RunRequest(command=("/bin/true",), id=f"w{i}") for i in range(8)]
            list(corral.ray.map(warm, runs_dir=runs))  # worker processes started
            reqs = [RunRequest(command=("/bin/true",), id=str(i)) for i in range(jobs)]
            t = time.perf_counter()
            got = list(corral.ray.map(reqs, runs_dir=runs))
            elapsed = time.perf_counter() - t
            assert all(r.ok for r in got)
            used = len({r.node for r in got})
            ray.shutdown()
            rows.append([str(nodes), str(used), f"{rate(jobs, elapsed):.0f}"])
    finally:
        cluster.shutdown()
    local = engine_pool(["/bin/true"], default_workers(), jobs, runs)
    rows.append(["(local engine, same cores)", "-", f"{local:.0f}"])
    return ("### Ray engine on local nodes (`/bin/true`, runs/s)\n\n"
            + table(["nodes", "nodes used", "runs/s"], rows))


READING = """
Reading these figures: the load above is the machine's, shared with other sessions' test
runs; the same script on the same machine gave figures up to 3x apart from one run to the
next, so compare the columns of one run, not runs with each other. The gap between a corral
pool and the raw pool is corral's own launch (issue 12: cgroups, the init, the record), which
every engine pays through the one launcher and gains from when it gets faster; the first
table is what the request layer adds on top of it (staging, its run directory, removal).
A second Ray node on the same two cores adds scheduling, not CPU.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument("--quick", action="store_true", help="fewer runs per figure")
    args = parser.parse_args()
    jobs = 60 if args.quick else 200
    runs = tempfile.mkdtemp(prefix="corral-bench-runs-")
    try:
        parts = [layer_section(jobs, runs), local_section(jobs, runs),
                 serve_section(jobs, runs), ray_section(jobs, runs)]
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    load = os.getloadavg()[0]
    text = (f"## Scale (`bench/scale.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
            f"load {load:.1f} at the end, {'root' if os.geteuid() == 0 else 'user'})\n\n"
            + "\n".join(parts))
    text += READING
    print(text)
    if args.write:
        write_section("scale.py", text)


if __name__ == "__main__":
    main()
