"""How long a planted ``commondir`` lives before corral's live watch removes it, and what
the audit costs a run.

    .venv/bin/python bench/livewatch.py [TIMES]

Window: a watched git directory (corral.livewatch, the same code a run uses); another
process writes ``commondir`` the way git writes files (a lock file, then a rename) and
polls with ``lstat`` until it is gone.  Reported as median, 95th percentile and maximum
from that writer's side: the time host git could see the file is at most this.  Run it
idle and under load (another process spinning on each core) to see the spread.

Audit: :class:`corral.audit.Auditor` over a tree of 20,000 files in 1,000 folders with 10
git directories, as after a run that changed nothing, against ``os.walk`` over the same
tree (the floor of any walk in Python).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from corral import audit
from corral.livewatch import LiveWatch

WRITER = r"""
import os, sys, time
gitdir, times = sys.argv[1], int(sys.argv[2])
out = []
for _ in range(times):
    start = time.perf_counter()
    with open(gitdir + "/commondir.lock", "w") as f:
        f.write("../elsewhere\n")
    os.rename(gitdir + "/commondir.lock", gitdir + "/commondir")
    while os.path.lexists(gitdir + "/commondir"):
        pass
    out.append(time.perf_counter() - start)
    time.sleep(0.01)
print(" ".join(map(str, out)))
"""


def window(times: int) -> list[float]:
    top = tempfile.mkdtemp(prefix="corral-bench-")
    subprocess.run(["git", "init", "-q", top], check=True)
    gitdir = os.path.join(top, ".git")
    with LiveWatch([(gitdir, top, None)]):
        done = subprocess.run([sys.executable, "-c", WRITER, gitdir, str(times)],
                              capture_output=True, text=True, check=True)
    subprocess.run(["rm", "-rf", top], check=True)
    return sorted(float(x) for x in done.stdout.split())


def audit_cost() -> tuple[float, float]:
    top = tempfile.mkdtemp(prefix="corral-bench-")
    for d in range(1000):
        os.makedirs(os.path.join(top, f"d{d}"))
        for f in range(20):
            open(os.path.join(top, f"d{d}", f"f{f}.py"), "w").close()
    for g in range(10):
        subprocess.run(["git", "init", "-q", os.path.join(top, f"d{g}")], check=True)
    census = audit.Census(((top, None),), audit.protected_names(),
                          gitdirs=frozenset(os.path.join(top, f"d{g}", ".git")
                                            for g in range(10)))
    start = time.perf_counter()
    actions = audit.Auditor(census, lambda: "/nonexistent").run()
    took = time.perf_counter() - start
    assert not actions, actions
    start = time.perf_counter()
    for _ in os.walk(top):
        pass
    floor = time.perf_counter() - start
    subprocess.run(["rm", "-rf", top], check=True)
    return took, floor


def main() -> None:
    times = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    w = window(times)
    p95 = w[int(len(w) * 0.95) - 1]
    print(f"live watch window over {times} plants: median {statistics.median(w) * 1e3:.2f} ms, "
          f"p95 {p95 * 1e3:.2f} ms, max {w[-1] * 1e3:.2f} ms")
    took, floor = audit_cost()
    print(f"audit of 20,000 files, 10 repositories: {took * 1e3:.0f} ms "
          f"(os.walk of the same tree: {floor * 1e3:.0f} ms, ratio {took / floor:.1f})")


if __name__ == "__main__":
    main()
