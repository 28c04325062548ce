"""What the seccomp filter costs a launch: compile once per process, then per run.

    .venv/bin/python bench/seccomp.py [RUNS]

Prints, as medians:

* the first ``programs()`` call in a fresh interpreter (load libseccomp,
  compile both programs) and a cached call;
* launching ``/bin/true`` through corral's resolve + launch with the filters
  (bwrap's ``--seccomp`` and the payload filter of the python profile),
  and the same sandbox without them, interleaved, with their ratio;
* raw bwrap (the seed recipe) launching ``/bin/true``, for scale;
* the cost per system call inside the sandbox: a Python loop of
  ``getppid()`` (allowed by number) and of ``ioctl(TCGETS)`` on a pty (an
  argument rule), timed inside, with and without the filters, interleaved.

Ratios come from the same run; absolute times depend on the machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from corral import api, host, launch, resolve, seccomp
from corral.profiles import load_profile
from corral.record import replace

COLD = ("import time; t = time.perf_counter(); from corral import seccomp; "
        "a = time.perf_counter(); seccomp.programs(False); b = time.perf_counter(); "
        "seccomp.programs(False); c = time.perf_counter(); print(a - t, b - a, c - b)")
RAW = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib",
       "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
       "--unshare-all", "--new-session", "--die-with-parent", "--clearenv", "--cap-drop", "ALL",
       "--", "/bin/true"]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def cold(runs: int) -> list[str]:
    samples = [tuple(map(float, subprocess.run([sys.executable, "-c", COLD], check=True,
                                               capture_output=True, text=True).stdout.split()))
               for _ in range(runs)]
    return [f"| {what} | {statistics.median(s[i] for s in samples) * 1e6:.1f} µs |"
            for i, what in enumerate(("from corral import seccomp (cold interpreter)",
                                      "first programs(): load libseccomp and compile",
                                      "cached programs()"))]


def launches(runs: int) -> list[str]:
    policy = load_profile("python")
    facts = host.detect()
    bwrap = facts.require_bwrap()
    run_dir, (uid, gid) = api.prepare(policy, workspace_dir=None, inputs=(), runs_dir=None,
                                      facts=facts)

    def once(filtered: bool) -> float:
        start = time.perf_counter()
        sb = resolve.resolve_run(policy, ["/bin/true"], facts, run_dir.workspace, uid, gid)
        if not filtered:
            config = {k: v for k, v in sb.init_config.items() if k != "payload_seccomp"}
            sb = replace(sb, seccomp=None, init_config=config)
        out = launch.launch(sb, capture=True, stdin=None, output_cap=1 << 16, timeout_s=60,
                            bwrap_path=bwrap)
        assert out.exit_code == 0, out
        return time.perf_counter() - start

    def raw() -> float:
        start = time.perf_counter()
        subprocess.run([bwrap, *RAW], check=True, env={})
        return time.perf_counter() - start

    seccomp.programs(False)  # compiled once, as in any long-lived caller
    times: dict[str, list[float]] = {"with filters": [], "without": [], "raw bwrap": []}
    for _ in range(runs):
        times["with filters"].append(once(True))
        times["without"].append(once(False))
        times["raw bwrap"].append(raw())
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [f"| launch /bin/true (python profile), {what} | {ms(value)} |"
            for what, value in med.items()]
    rows.append(f"| with / without filters | {med['with filters'] / med['without']:.3f}x |")
    return rows


PER_CALL = """\
import fcntl, os, termios, time
N = 200000
_, tty = os.openpty()
out = []
for call in (os.getppid, lambda: fcntl.ioctl(tty, termios.TCGETS, bytes(60))):
    start = time.perf_counter()
    for _ in range(N):
        call()
    out.append((time.perf_counter() - start) / N)
print(*out)
"""


def per_call(runs: int) -> list[str]:
    """Nanoseconds per call inside the sandbox, with and without the filters."""
    policy = load_profile("python")
    facts = host.detect()
    run_dir, (uid, gid) = api.prepare(policy, workspace_dir=None, inputs=(), runs_dir=None,
                                      facts=facts)

    def once(filtered: bool) -> tuple[float, ...]:
        sb = resolve.resolve_run(policy, ["python3", "-c", PER_CALL], facts, run_dir.workspace,
                                 uid, gid)
        if not filtered:
            config = {k: v for k, v in sb.init_config.items() if k != "payload_seccomp"}
            sb = replace(sb, seccomp=None, init_config=config)
        out = launch.launch(sb, capture=True, stdin=None, output_cap=1 << 16, timeout_s=120,
                            bwrap_path=facts.require_bwrap())
        assert out.exit_code == 0, out
        return tuple(float(x) for x in (out.stdout or b"").split())

    samples: dict[bool, list[tuple[float, ...]]] = {True: [], False: []}
    for _ in range(runs):
        for filtered in (True, False):
            samples[filtered].append(once(filtered))
    rows = []
    for i, what in enumerate(("getppid() (allowed by number)",
                              "ioctl(TCGETS) on a pty (an argument rule)")):
        with_, without = (statistics.median(s[i] for s in samples[f]) for f in (True, False))
        rows.append(f"| {what}, per call in Python, with / without filters | "
                    f"{with_ * 1e9:.0f} / {without * 1e9:.0f} ns: {with_ / without:.3f}x |")
    return rows


def main() -> None:
    from results import write_section

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    load = os.getloadavg()[0]
    rows = ["## Seccomp (`bench/seccomp.py`)", "",
            f"Medians of {runs} interleaved launches (15 cold starts), "
            f"{time.strftime('%Y-%m-%d %H:%M %Z')}, load average {load:.1f} on "
            f"{os.cpu_count()} CPUs when it started (other work on the machine inflates the "
            "absolute times; the ratios compare rounds run side by side).", "",
            "| what | median |", "|---|---:|",
            *cold(min(runs, 15)), *launches(runs), *per_call(min(runs, 9))]
    print("\n".join(rows))
    write_section("seccomp.py", "\n".join(rows))


if __name__ == "__main__":
    main()
