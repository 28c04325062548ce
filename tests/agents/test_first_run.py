"""The interactive first run of Claude Code and Codex under corral, in a real terminal (tmux).

Both save what the user answers at their first start (Claude: the folder's trust and the
API key's approval in ``.claude.json``; Codex: the folder's trust in ``config.toml``).
Under corral they save it in corral's copy of their state, so the second start asks
nothing.  The control is the layout corral had before: the real state bound through, with
the settings file read-only (Codex) or the home read-only around ``.claude.json``
(Claude, which saves by writing a new file beside it and renaming): the answers are lost
and the second start asks again.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_lab import Lab
from agents_util import AGENTS, agents_for
from conftest import Identity
from fake_model import FakeModel
from terminal import Pane

pytestmark = pytest.mark.sandbox
STORE = ".local/state/corral/agents"


@pytest.fixture
def model() -> Iterator[FakeModel]:
    with FakeModel("echo TOOL-RAN") as m:
        yield m


def _start(who: Identity, lab: Lab, model: FakeModel, name: str, agents: Path,
           flags: list[str], args: list[str]) -> Pane:
    host = f"model.test:{model.port}"
    spec = AGENTS[name]
    env = {**spec.env(f"http://{host}"), "TERM": "xterm-256color"}
    pane = Pane(who, lab.project, env)
    deny = [w for t in spec.telemetry for w in ("--deny-domain", t)]
    corral = [who.prefix()[-1], "-m", "corral", "agent", *flags, "--ro", str(agents),
              "--allow-domain", host, "--resolve", "model.test:127.0.0.1", *deny, "--",
              str(agents / "node_modules/.bin" / name), *args]
    pane.line(shlex.join(corral))
    return pane


CLAUDE_TRUST = "Is this a project you created or one you trust"
CLAUDE_KEY = "Do you want to use this API key"
CLAUDE_READY = "shift+tab"


def _dialogs(pane: Pane, answers: dict[str, list[str]], ready: str, failed: str = "\0"
             ) -> list[str]:
    """Answer the questions the agent asks before it is ready (others, such as offers of
    new features, are dismissed with Esc); returns the questions it asked, and ``failed``
    too if that showed."""
    asked = []
    for _ in range(8):
        screen = pane.wait(lambda s: any(q in s for q in answers) or "Enter to confirm" in s
                           or "enter continue" in s or ready in s)
        if failed in screen:
            return [*asked, failed]
        question = next((q for q in answers if q in screen), None)
        if question is None and ready in screen:
            time.sleep(3)  # a question may still come over the first screen
            if not any(q in pane.screen() for q in answers):
                return asked
            continue
        time.sleep(1)  # drawn is not yet listening
        pane.keys(*(answers[question] if question else ["Escape"]))
        if question:
            asked.append(question)
        time.sleep(1)
    raise AssertionError(f"too many questions:\n{pane.screen()}")


def _claude(who: Identity, lab: Lab, model: FakeModel, agents: Path, flags: list[str]
            ) -> tuple[bool, bool, bool]:
    """One interactive session: answer what it asks, run a prompt, exit.  Returns whether
    it asked for the folder's trust and for the key's approval, and whether the model
    answered the prompt ("Not logged in" when the key's approval was lost)."""
    pane = _start(who, lab, model, "claude", agents, flags, [])
    try:
        asked = _dialogs(pane, {CLAUDE_TRUST: ["Down", "Enter"],  # "Yes, I trust this folder"
                                CLAUDE_KEY: ["Up", "Enter"]}, CLAUDE_READY)  # "Yes"
        asked_trust, asked_key = CLAUDE_TRUST in asked, CLAUDE_KEY in asked
        pane.line("run the test command")
        answered = "DONE" in pane.wait(lambda s: "DONE" in s or "Not logged in" in s)
        pane.line("/exit")
        pane.wait(lambda s: s.rstrip().endswith("host$"))
        return asked_trust, asked_key, answered
    finally:
        pane.close()


def test_claude_keeps_its_first_run_answers(who: Identity, lab: Lab, model: FakeModel,
                                            shared_tmp: Path) -> None:
    agents = agents_for(who, shared_tmp)
    (lab.home / ".claude.json").write_text('{"hasCompletedOnboarding": true}\n')
    lab.own(lab.home / ".claude.json")
    assert _claude(who, lab, model, agents, ["--profile", "claude"]) == (True, True, True)
    assert any("TOOL-RAN" in r for r in model.tool_results)
    saved = json.loads((lab.home / STORE / "claude/.claude/.claude.json").read_text())
    assert saved["projects"][str(lab.project)]["hasTrustDialogAccepted"] is True
    assert _claude(who, lab, model, agents, ["--profile", "claude"]) == (False, False, True)
    assert json.loads((lab.home / ".claude.json").read_text()) == \
        {"hasCompletedOnboarding": True}  # the real one: untouched
    # Control: the real ~/.claude and ~/.claude.json bound through, as corral had it.
    (lab.home / ".claude").mkdir(exist_ok=True)
    lab.own(lab.home / ".claude")
    old = ["--profile", "generic", "--rw", str(lab.home / ".claude"), "--rw",
           str(lab.home / ".claude.json"), "--env", "ANTHROPIC_API_KEY",
           "--env", "ANTHROPIC_BASE_URL", "--env", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
    first = _claude(who, lab, model, agents, old)
    assert first[0] and not first[2]  # the approval cannot even be kept for this session
    assert _claude(who, lab, model, agents, old)[0]  # and the trust is asked for again


CODEX_TRUST = "Trust this folder?"
CODEX_READY = "Ask Codex to do anything"
CODEX_FAILED = "failed to persist config"


def _codex(who: Identity, lab: Lab, model: FakeModel, agents: Path, flags: list[str]
           ) -> tuple[bool, bool]:
    """One interactive session: trust the folder if asked, wait for the prompt, quit.
    Returns whether it asked, and whether it could save the answer."""
    args = AGENTS["codex"].args(f"http://model.test:{model.port}")
    skip = ("exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox")
    interactive = [a for a in args if a not in skip][:-1]  # no prompt: the terminal UI
    pane = _start(who, lab, model, "codex", agents, flags, interactive)
    try:
        asked = _dialogs(pane, {CODEX_TRUST: ["Enter"]}, CODEX_READY, CODEX_FAILED)
        if CODEX_FAILED in asked:
            return True, False
        time.sleep(1)
        pane.keys("C-c")
        pane.keys("C-c")
        pane.wait(lambda s: s.rstrip().endswith("host$"))
        return CODEX_TRUST in asked, True
    finally:
        pane.close()


def test_codex_keeps_its_trust_answer(who: Identity, lab: Lab, model: FakeModel,
                                      shared_tmp: Path) -> None:
    agents = agents_for(who, shared_tmp)
    assert _codex(who, lab, model, agents, ["--profile", "codex"]) == (True, True)
    saved = (lab.home / STORE / "codex/.codex/config.toml").read_text()
    assert f'[projects."{lab.project}"]' in saved and 'trust_level = "trusted"' in saved
    assert _codex(who, lab, model, agents, ["--profile", "codex"]) == (False, True)
    assert not (lab.home / ".codex" / "config.toml").exists()
    # Control: the real ~/.codex bound through with its config.toml read-only, as corral
    # had it: the answer cannot be saved.
    (lab.home / ".codex").mkdir(exist_ok=True)
    (lab.home / ".codex" / "config.toml").write_text("")
    lab.own(lab.home / ".codex")
    old = ["--profile", "generic", "--rw", str(lab.home / ".codex"), "--ro",
           str(lab.home / ".codex" / "config.toml"), "--env", "OPENAI_API_KEY"]
    assert _codex(who, lab, model, agents, old) == (True, False)  # "failed to persist"
