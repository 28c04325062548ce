"""Real agents start under the seccomp allow-list (issue 15): their native and Node
binaries make unusual calls (Bun sets its threads' scheduling by thread id, Node
probes clone3), and each must still answer ``--version`` and ``--help`` inside
``corral agent``.

The agents come from their registries (``npm install --prefix DIR
@anthropic-ai/claude-code @openai/codex @google/gemini-cli
@mariozechner/pi-coding-agent``); ``CORRAL_AGENTS_DIR`` names DIR.  They belong to
``make test-agents`` (scripts/test-agents installs the agents and sets it); ``make test``
does not collect this folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agent_lab import Lab
from conftest import Identity

pytestmark = pytest.mark.sandbox
AGENTS = {"claude": (r"^\d+\.\d+\.\d+ \(Claude Code\)$", "Usage: claude"),
          "codex": (r"^codex-cli \d+\.\d+\.\d+$", "Codex CLI"),
          "gemini": (r"^\d+\.\d+\.\d+$", "Usage: gemini"),
          "pi": (r"^\d+\.\d+\.\d+$", "Usage:")}


def _binary(name: str) -> Path:
    folder = os.environ.get("CORRAL_AGENTS_DIR")
    assert folder, "set CORRAL_AGENTS_DIR to an npm prefix holding the agents " \
        "(make test-agents does)"
    path = Path(folder) / "node_modules" / ".bin" / name
    assert path.exists(), f"{name} is not installed under {folder}"
    return path


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_each_agent_starts_under_the_allow_list(who: Identity, lab: Lab, name: str) -> None:
    binary = _binary(name)
    version, usage = AGENTS[name]
    # The agents' folder read-only: it may sit in a tree the sandbox hides (/tmp).
    ro = ("--ro", str(binary.parents[2]))
    r = who.corral("agent", *ro, "--", str(binary), "--version", cwd=lab.project)
    said = [line for line in (r.stdout + r.stderr).splitlines()
            if not line.startswith("corral: ")]  # pi answers on stderr
    assert r.returncode == 0 and any(re.match(version, line) for line in said), r
    r = who.corral("agent", *ro, "--", str(binary), "--help", cwd=lab.project)
    assert r.returncode == 0 and usage in r.stdout + r.stderr, (r.stdout[-2000:],
                                                                 r.stderr[-2000:])
