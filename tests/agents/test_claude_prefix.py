"""Claude Code with ``CLAUDE_CODE_SHELL_PREFIX='corral shell --prefix'``: every Bash call in its
own sandbox, Claude's shell snapshot and working directory still working (make test-agents).

The fake model asks for two commands: ``cd nested`` plus a function the user's ~/.bashrc
defines (Claude's shell snapshot carries it) plus a read of the token; then ``pwd``.  The
control is the recipe an earlier docs/agents.md gave, ``corral shell -c "$1"``: contained
too, but the snapshot's function is gone and the ``cd`` is forgotten.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from agent_lab import Lab
from agents_util import AGENTS, agents_for
from conftest import Identity
from fake_model import FakeModel

pytestmark = pytest.mark.sandbox
RC = "# rc\ncorral_fn() { echo SNAPSHOT-FN; }\n"
FIRST = "cd nested && corral_fn; cat ~/.fake-creds/token; echo TOOL-1"
SECOND = "pwd; echo TOOL-2"


def _claude(who: Identity, lab: Lab, agents: Path, prefix: str) -> FakeModel:
    spec = AGENTS["claude"]
    with FakeModel(FIRST, SECOND) as model:
        base = f"http://127.0.0.1:{model.port}"
        env = {**spec.env(base), "HOME": str(lab.home), "SHELL": "/bin/bash",
               "CLAUDE_CODE_SHELL_PREFIX": prefix}
        r = who.run([str(agents / "node_modules/.bin/claude"), *spec.args(base)],
                    cwd=lab.project, env=env, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert len(model.tool_results) == 2, model.tool_results
        return model


def test_prefix_mode_keeps_the_snapshot_and_the_directory(who: Identity, lab: Lab,
                                                          shared_tmp: Path) -> None:
    agents = agents_for(who, shared_tmp)
    (lab.home / ".bashrc").write_text(RC)
    corral = shlex.join([*who.prefix()[-1:], "-m", "corral"])
    # What `pip install corral` puts on PATH as corral-prefix, for this identity's Python.
    prefix = lab.home / "dev" / "corral-prefix"
    prefix.write_text(f"#!{who.prefix()[-1]}\nfrom corral.cli import prefix_main\n"
                      "prefix_main()\n")
    prefix.chmod(0o755)
    lab.own(prefix)
    model = _claude(who, lab, agents, str(prefix))
    first, second = model.tool_results
    assert "SNAPSHOT-FN" in first and "TOOL-1" in first, first
    assert lab.token not in model.seen()
    assert f"{lab.project}/nested" in second, second
    assert (lab.home / ".bashrc").read_text() == RC
    # Control: the old recipe runs the string with sh -c in a sandbox that has neither
    # the snapshot nor the host's /tmp, where the cwd file goes.
    old = lab.home / "dev" / "old-prefix"
    old.write_text(f'#!/bin/sh\nexec {corral} shell -c "$1"\n')
    old.chmod(0o755)
    lab.own(old)
    ctl = _claude(who, lab, agents, str(old))
    first, second = ctl.tool_results
    assert "SNAPSHOT-FN" not in first and "TOOL-1" in first, first
    assert f"{lab.project}/nested" not in second, second
