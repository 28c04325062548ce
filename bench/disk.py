"""The disk bound's cost per run: a workspace image of its own against a watched directory.

    sudo .venv/bin/python bench/disk.py [--runs N] [--write]

Started by root, a fresh workspace with a disk limit is an ext4 image
(corral.diskimage): made, mounted, copied out and deleted at every run.  This
measures what that costs, in the same rounds, against the same run with the
limit only watched (what a plain user, a reused workspace, or a host without
loop devices gets), without a disk limit, and against the seed's plain bwrap
line (the floor).  Two payloads: ``/bin/true``, and one that writes 10 MiB in
100 files (so the copy-out has something to copy).  Then the image's own
steps, alone.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from launch import SEED, machine, measure, options, scratch, table, timed  # this folder

from corral import api, enforce, host
from corral.diskimage import Image
from corral.policy import Limits, Policy

MiB = 1 << 20
WRITE = ("import os\nfor i in range(100):\n"
         "    with open(f'/work/f{i}', 'wb') as f:\n        f.write(os.urandom(102400))\n")


@contextlib.contextmanager
def watched_only() -> Iterator[None]:
    """The same run as if the host could not make images: the limit is only watched."""
    real = enforce.image_unavailable
    enforce.image_unavailable = lambda *a, **k: "bench: watched only"  # type: ignore[assignment]
    try:
        yield
    finally:
        enforce.image_unavailable = real  # type: ignore[assignment]


def variants(runs_dir: Path, cmd: list[str]) -> dict[str, Callable[[], float]]:
    base = Limits(memory_bytes=2048 * MiB, pids=512)
    capped = Policy(limits=Limits(memory_bytes=2048 * MiB, pids=512, disk_bytes=2048 * MiB))
    bwrap = host.detect().require_bwrap()

    def run(policy: Policy) -> Callable[[], float]:
        return lambda: timed(lambda: api.run(cmd, policy, runs_dir=str(runs_dir)))

    def watched() -> float:
        with watched_only():
            return run(capped)()

    scratch_ws = runs_dir.parent / "seed-work"
    scratch_ws.mkdir(exist_ok=True)
    seed = [bwrap, "--bind", str(scratch_ws), "/work", *SEED[:-1], *cmd]
    return {
        "raw bwrap, seed line": lambda: timed(lambda: subprocess.run(
            seed, check=True, stdout=subprocess.DEVNULL)),
        "corral.run(), no disk limit": run(Policy(limits=base)),
        "corral.run(), disk limit watched": watched,
        "corral.run(), disk limit, own file system": run(capped),
    }


def steps(base: Path, rounds: int) -> list[str]:
    """The image's own steps: make (sparse file, mke2fs, loop device, mount), copy out
    10 MiB in 100 files, let go."""
    made, exported, closed = [], [], []
    for i in range(rounds):
        run_root = base / f"r{i}"
        (run_root / "work").mkdir(parents=True)
        os.chown(run_root / "work", 65534, 65534)  # as corral.workspace.prepare leaves it
        image = Image(str(run_root / "work.img"), 2048 * MiB, (65534, 65534))
        made.append(timed(image.create))
        root = image.root()
        try:
            for n in range(100):
                fd = os.open(f"f{n}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=root)
                os.write(fd, os.urandom(102400))
                os.close(fd)
        finally:
            os.close(root)
        exported.append(timed(lambda i=image, d=run_root: i.export(str(d / "work"))))
        assert image.exported is not None and image.exported.complete, image.exported
        closed.append(timed(image.close))
    return ["### the image's own steps (2 GiB capacity)", "", "| step | median |", "|---|---|",
            f"| make: sparse file, mke2fs, loop device, mount | "
            f"{statistics.median(made) * 1e3:.2f} ms |",
            f"| copy out 10 MiB in 100 files | {statistics.median(exported) * 1e3:.2f} ms |",
            f"| let go (unmount, free the loop device, delete) | "
            f"{statistics.median(closed) * 1e3:.2f} ms |", ""]


def main() -> None:
    args = options(__doc__)
    if not host.detect().is_root:
        print("bench/disk.py: skipped: the workspace image is made only when corral runs as "
              "root")
        return
    out = [f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}, "
           f"{args.runs} rounds.", ""]
    for title, cmd in (("/bin/true", ["/bin/true"]),
                       ("writing 10 MiB in 100 files", ["/usr/bin/python3", "-c", WRITE])):
        with scratch() as base:
            medians = measure(variants(base / "runs", cmd), args.runs)
            out += table(f"{title}: the disk bound per run", medians,
                         "corral.run(), disk limit watched", {})
    with scratch() as base:
        out += steps(base, args.runs)
    print("\n".join(out))
    if args.write:
        from results import write_section

        write_section("disk.py", "## The disk bound's cost (`bench/disk.py`)\n\n" + "\n".join(out))


if __name__ == "__main__":
    main()
