"""A real agent registers ``corral mcp`` the documented way and runs code through it, driven
by the fake model (make test-agents).

For Claude Code and Codex, as root and as the test user: in the agent's home for the test,
``claude mcp add corral -- corral mcp ...`` (or ``codex mcp add``, the same words), then the
agent in print/exec mode, where the fake model answers with a call of
``mcp__corral__run_code``.  The code tries to append to ``~/.bashrc``, write into the
project, read the lab's token and reach a loopback canary, then writes a file into its
workspace.  Through corral: the result comes back to the model, nothing of that lands, the
session's workspace is there while the agent waits for the model and gone once the agent
has exited.  The control registers a plain unsandboxed runner (tests/agents/plain_mcp.py,
same name, same tool) the same way: everything lands.

``corral`` on the agent's PATH is what ``pip install 'corral[mcp]'`` puts there: a script
that starts ``corral.cli:main`` with the identity's Python, on a path where it finds corral
and the MCP SDK (Codex starts MCP servers with a filtered environment, so nothing may ride
on PYTHONPATH).  The test names ``--runs-dir`` so that it can watch the workspace; Codex
would not pass CORRAL_RUNS_DIR either.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent_lab import Lab
from agents_util import AGENTS, agents_for
from conftest import Identity, processes_with
from egress_util import Origin
from fake_model import FakeModel
from mcp_util import eventually, sdk

pytestmark = pytest.mark.sandbox
__all__ = ["sdk"]  # the fixture, imported for pytest

HERE = Path(__file__).resolve().parent
PROMPT = "Run the test code with corral's run_code tool."
TOOL = "mcp__corral__run_code"
CODE = """
import os, urllib.request
print("CWD", os.getcwd())
for path in {targets!r}:
    try:
        with open(path, "a") as f:
            f.write("pwn\\n")
        print("WROTE", path)
    except OSError as e:
        print("REFUSED", path, e.errno)
try:
    print("TOKEN", open({token!r}).read())
except OSError as e:
    print("NO-TOKEN", e.errno)
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
    opener.open("http://127.0.0.1:{port}/from-mcp", timeout=10)
    print("REACHED")
except Exception as e:
    print("OFFLINE", type(e).__name__)
open("kept.txt", "w").write("kept")
print("CODE-RAN")
"""


def _script(who: Identity, sdk: Path | None, path: Path, body: str) -> Path:
    """An executable Python script for ``who``: its Python, corral and the SDK importable."""
    dirs = [str(d) for d in (who.src, sdk) if d is not None] if who.src is not None else []
    path.write_text(f"#!{who.prefix()[-1]}\nimport sys\nsys.path[:0] = {dirs!r}\n{body}")
    path.chmod(0o755)
    return path


def _bin(who: Identity, sdk: Path | None) -> Path:
    """A folder for the agent's PATH with ``corral`` and the control's ``plain-mcp``."""
    bindir = who.tmp / "bin"
    bindir.mkdir()
    bindir.chmod(0o755)
    _script(who, sdk, bindir / "corral", "from corral.cli import main\nmain()\n")
    _script(who, sdk, bindir / "plain-mcp", (HERE / "plain_mcp.py").read_text())
    return bindir


class Driver:
    """One agent, its home and PATH for the test: registering and running as ``who``."""

    def __init__(self, who: Identity, lab: Lab, name: str, agents: Path, bindir: Path):
        self.who, self.lab, self.name = who, lab, name
        self.exe = str(agents / "node_modules" / ".bin" / name)
        self.env = {"HOME": str(lab.home), "TERM": "dumb",
                    "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin"}

    def mcp(self, *args: str) -> None:
        """``claude mcp ARGS`` / ``codex mcp ARGS``."""
        r = self.who.run([self.exe, "mcp", *args], cwd=self.lab.project, env=self.env,
                         timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    def ask(self, model: FakeModel, extra: dict[str, str] | None = None) -> str:
        """The agent, once, against ``model``; returns its output.  Neither agent waits for
        its MCP servers before its first request unless told to (a loaded machine starts
        corral mcp later than that): so told, with a generous start-up allowance."""
        base = f"http://127.0.0.1:{model.port}"
        spec = AGENTS[self.name]
        if self.name == "claude":
            args = ["-p", PROMPT, "--allowedTools", TOOL, "--model", "claude-sonnet-4-5"]
            env = {**spec.env(base), "MCP_CONNECTION_NONBLOCKING": "false",
                   "MCP_TIMEOUT": "120000"}
        else:
            args = [*spec.args(base)[:-1], "-c", "mcp_servers.corral.required=true",
                    "-c", "mcp_servers.corral.startup_timeout_sec=120", PROMPT]
            env = spec.env(base)
        r = self.who.run([self.exe, *args], cwd=self.lab.project,
                         env={**self.env, **env, **(extra or {})}, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout[-3000:] + r.stderr[-3000:]


def _workspaces(runs: Path) -> list[Path]:
    return sorted(runs.glob("mcp-*/*/work"))


def _call(lab: Lab, port: int) -> tuple[str, dict[str, str]]:
    targets = [str(lab.home / ".bashrc"), str(lab.project / "pwned.txt")]
    code = CODE.format(targets=targets, token=str(lab.home / ".fake-creds" / "token"),
                       port=port)
    return TOOL, {"language": "python", "code": code}


def _watch(runs: Path, during: list[Path]) -> Callable[[str], None]:
    """Records, as the tool result reaches the model, the workspaces holding kept.txt."""
    return lambda result: during.extend(w for w in _workspaces(runs)
                                        if (w / "kept.txt").exists())


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_agent_runs_code_through_corral_mcp(who: Identity, lab: Lab, shared_tmp: Path,
                                            sdk: Path | None, name: str) -> None:
    agents = agents_for(who, shared_tmp)
    bindir = _bin(who, sdk)
    runs = who.tmp / "mcp-runs"
    agent = Driver(who, lab, name, agents, bindir)
    agent.mcp("add", "corral", "--", "corral", "mcp", "--profile", "python",
              "--runs-dir", str(runs))
    extra = {"ENABLE_TOOL_SEARCH": "false"} if name == "claude" else {}
    with Origin() as canary:
        with FakeModel(_call(lab, canary.port)) as model:
            during: list[Path] = []
            model.on_result = _watch(runs, during)
            out = agent.ask(model, extra)
        assert model.tool_calls == 1 and len(model.tool_results) == 1, \
            (model.offered, model.tool_results, out)
        result = model.tool_results[0]
        assert "CODE-RAN" in result and "CWD /work" in result, result
        assert "WROTE" not in result and "REACHED" not in result, result
        assert lab.token not in model.seen()
        assert (lab.home / ".bashrc").read_text() == "# rc\n"
        assert not (lab.project / "pwned.txt").exists()
        assert canary.connections == 0
        # The session's workspace held the file while the agent waited; once the agent has
        # gone, so have the server and the workspace.
        assert len(during) == 1, (during, result)
        assert eventually(lambda: not processes_with(str(runs)))
        assert eventually(lambda: not _workspaces(runs)), _workspaces(runs)
        assert not during[0].exists()
        if name == "claude":
            _claude_needs_tool_search_off(agent, lab, canary.port)
        # Control: a plain runner registered the same way lets it all land.
        agent.mcp("remove", "corral")
        agent.mcp("add", "corral", "--", "plain-mcp")
        with FakeModel(_call(lab, canary.port)) as ctl:
            agent.ask(ctl, extra)
        assert ctl.tool_calls == 1 and "CODE-RAN" in ctl.tool_results[0], ctl.tool_results
        assert "WROTE" in ctl.tool_results[0] and lab.token in ctl.seen()
        assert "pwn" in (lab.home / ".bashrc").read_text()
        assert (lab.project / "pwned.txt").exists()
        assert canary.connections >= 1


def _claude_needs_tool_search_off(agent: Driver, lab: Lab, port: int) -> None:
    """Without ENABLE_TOOL_SEARCH=false, Claude Code 2.1.328 offers MCP tools only behind its
    ToolSearch tool, so a model that does not search never sees run_code."""
    with FakeModel(_call(lab, port)) as model:
        agent.ask(model)
    assert model.tool_calls == 0, model.offered
    offered = {n for names in model.offered for n in names}
    assert TOOL not in offered and "ToolSearch" in offered, offered
