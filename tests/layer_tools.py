"""Helpers for tests of the kernel layers: probes handed to a test identity, and
``without``, which runs corral's exact sandbox minus chosen layers (``tests/layers.py``).

The ``layers`` fixture is registered in ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Identity, need

HERE = Path(__file__).resolve().parent
PROBES = HERE / "probes"


def need_x86_64() -> None:
    need(os.uname().machine == "x86_64", "the probe uses x86_64 system-call numbers")


@pytest.fixture(scope="session")
def layers(shared_tmp: Path) -> Path:
    """tests/layers.py, copied where the test user can read it."""
    dest = shared_tmp / "layers.py"
    shutil.copy(HERE / "layers.py", dest)
    dest.chmod(0o644)
    return dest


def give(who: Identity, name: str, text: str | bytes) -> Path:
    """A file in ``who``'s directory, readable by the sandbox (owned as its payload's files)."""
    path = who.tmp / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o644)
    return who.chown(path)


def probe(who: Identity, name: str) -> Path:
    """``tests/probes/NAME``, given to ``who``."""
    return give(who, name, (PROBES / name).read_text())


def without(who: Identity, layers: Path, off: list[str], *args: str) -> dict[str, Any]:
    """Run corral's sandbox with the ``off`` layers removed; see tests/layers.py."""
    flags = [word for layer in off for word in ("--off", layer)]
    proc = subprocess.run([*who.prefix(), str(layers), *flags, *args], env=who.environ(),
                          cwd=who.tmp, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data
