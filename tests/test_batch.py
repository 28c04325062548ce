"""``corral batch``: one result per job, written as it finishes, exactly once across resumes.

Runs the real command line with the local engine, as root and as the test user.  Each job
leaves a trace in its kept run directory (``--keep``), so a test can count how often a job
really ran, not only how many results were written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, need

pytestmark = pytest.mark.sandbox


def write_jobs(path: Path, jobs: list[Any]) -> Path:
    path.write_text("".join((j if isinstance(j, str) else json.dumps(j)) + "\n" for j in jobs))
    path.chmod(0o644)
    return path


def results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def executions(who: Identity) -> Counter[str]:
    """How often each job ran: its kept run directories hold a file named after its id."""
    seen: Counter[str] = Counter()
    for work in (who.tmp / "runs").glob("req-*/*/work"):
        seen.update(p.name.removeprefix("ran-") for p in work.glob("ran-*"))
    return seen


def job(name: str, seconds: float = 0) -> dict[str, Any]:
    return {"id": name, "command": ["/bin/sh", "-c", f"sleep {seconds}; : > /work/ran-{name}"]}


def test_every_line_gets_one_result(who: Identity) -> None:
    jobs = write_jobs(who.tmp / "jobs.jsonl", [
        {"id": "ok", "code": "print('hi')", "language": "python"},
        {"id": "three", "command": ["/bin/sh", "-c", "exit 3"]},
        "this is not JSON",
        {"id": "cobol", "code": "x", "language": "cobol"},
        {"id": "ok", "command": ["/bin/true"]},
        "",
        {"command": ["/bin/echo", "anonymous"]},
        {"id": "slow", "command": ["/bin/sleep", "30"], "limits": {"timeout": 1}},
    ])
    out = who.tmp / "out.jsonl"
    proc = who.corral("batch", str(jobs), "-o", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    got = {r["id"]: r for r in results(out)}
    assert len(got) == len(results(out)) == 7, "one result per non-blank line, ids unique"
    assert got["ok"]["ok"] and got["ok"]["run"]["stdout"] == "hi\n"
    assert got["three"]["exit_code"] == 3 and got["slow"]["status"] == "timeout"
    assert got["line-3"]["status"] == "invalid" and "not JSON" in got["line-3"]["error"]
    assert got["cobol"]["status"] == "invalid" and "cobol" in got["cobol"]["error"]
    assert got["line-5"]["status"] == "invalid" and "repeats" in got["line-5"]["error"]
    assert got["line-7"]["run"]["stdout"] == "anonymous\n"
    assert "corral: batch: 7 results" in proc.stderr
    assert not any((who.tmp / "runs").iterdir()), "no run directory is left behind"
    # An existing output is never mixed with a new batch.
    again = who.corral("batch", str(jobs), "-o", str(out))
    assert again.returncode == 125 and "--resume" in again.stderr


def test_resume_runs_each_job_exactly_once(who: Identity) -> None:
    names = [f"j{i}" for i in range(12)]
    jobs = write_jobs(who.tmp / "jobs.jsonl", [job(n, 1) for n in names])
    out = who.tmp / "out.jsonl"
    cmd = [*who.prefix(), "-m", "corral", "batch", str(jobs), "-o", str(out), "--workers", "2",
           "--keep", "--quiet"]
    # SIGINT as a terminal's Ctrl-C sends it (a shell's background job would ignore it).
    proc = subprocess.Popen(cmd, env=who.environ(), cwd=who.tmp, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                        signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while (not out.exists() or len(out.read_text().splitlines()) < 3) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT if who.is_root else signal.SIGTERM)  # both stop it cleanly
    _, err = proc.communicate(timeout=120)
    first = {r["id"] for r in results(out)}
    assert 3 <= len(first) < len(names), err
    resumed = who.corral("batch", str(jobs), "-o", str(out), "--resume", "--keep")
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["id"] for r in results(out)]
    assert sorted(ids) == sorted(names), "every job has exactly one result"
    assert executions(who) == Counter(names), "and ran exactly once"
    # The control: a result lost (its line cut off by a crash mid-write) makes its job run
    # again, and the count shows it.
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][:20])
    who.corral("batch", str(jobs), "-o", str(out), "--resume", "--keep")
    assert sorted(r["id"] for r in results(out)) == sorted(names)
    lost = json.loads(lines[-1])["id"]
    assert executions(who) == Counter(names) + Counter([lost])


def test_output_and_memory_stay_bounded(who: Identity) -> None:
    """Twelve jobs of 100 MB of output each: corral keeps 8 MiB of each and its own memory
    far below what the jobs wrote."""
    big = {"command": ["/bin/sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x"]}
    jobs = write_jobs(who.tmp / "jobs.jsonl", [{**big, "id": str(i)} for i in range(12)])
    out = who.tmp / "out.jsonl"
    script = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([*who.prefix(), "-c", script, who.prefix()[-1], "-m", "corral", "batch",
                           str(jobs), "-o", str(out), "--workers", "2"], env=who.environ(),
                          cwd=who.tmp, capture_output=True, text=True, timeout=600, check=False)
    peak_kib = int(proc.stdout.split()[-1])
    got = results(out)
    assert len(got) == 12 and all(r["status"] == "output-limit" for r in got)
    assert all(len(r["run"]["stdout"]) == 8 << 20 for r in got)
    assert peak_kib < 400 << 10, f"batch peaked at {peak_kib} KiB for 1.2 GB of output"


def test_progress_on_a_terminal(root: Identity) -> None:
    """On a terminal, tqdm shows done, failed, timed out and the rate (root runs the checkout's
    venv, which has the progress extra; the test user's plain python falls back to lines)."""
    need(importlib.util.find_spec("tqdm") is not None, "tqdm (corral[progress]) is installed")
    jobs = write_jobs(root.tmp / "jobs.jsonl", [job(str(i), 0.2) for i in range(6)]
                      + [{"id": "t", "command": ["/bin/sleep", "9"], "limits": {"timeout": 1}}])
    out = root.tmp / "out.jsonl"
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(root.tmp)
        os.execve(sys.executable, [sys.executable, "-m", "corral", "batch", str(jobs), "-o",
                                   str(out)], root.environ())
    screen = b""
    try:
        while True:
            screen += os.read(fd, 65536)
    except OSError:
        pass
    os.waitpid(pid, 0)
    text = screen.decode(errors="replace")
    assert "7/7" in text and "run/s" in text and "timeout=1" in text, text
    assert "corral: batch: 7 results" in text
    # Not a terminal: no bar, only the summary.
    plain = root.corral("batch", str(jobs), "-o", str(root.tmp / "out2.jsonl"))
    assert "run/s" not in plain.stderr and "corral: batch: 7 results" in plain.stderr
