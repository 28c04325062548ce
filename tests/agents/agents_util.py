"""The real agents, as installed by ``scripts/install-agents`` into ``.agents/``, and how each
is started against the fake model server (tests/fake_model.py).

Every command line here is the one docs/agents.md shows as tested; keep them in step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conftest import CI, IS_ROOT, Identity, need

CHECKOUT = Path(__file__).resolve().parents[2]
AGENTS_DIR = Path(os.environ.get("CORRAL_AGENTS_DIR", CHECKOUT / ".agents"))
PROMPT = "Run the test command with your shell tool."


@dataclass(frozen=True)
class Agent:
    """One agent: its program, its arguments and variables for a model at ``base``, the
    files it needs in its real state first, and the hosts it reports to on its own."""

    name: str
    args: Callable[[str], list[str]]
    env: Callable[[str], dict[str, str]]
    files: Callable[[str], dict[str, str]] = lambda base: {}
    telemetry: tuple[str, ...] = ()
    api_path: str = "/v1"  # what the base URL ends with
    extra: dict[str, str] = field(default_factory=dict)


def _pi_models(base: str) -> dict[str, str]:
    models = {"providers": {"fake": {
        "baseUrl": base + "/v1", "api": "openai-completions", "apiKey": "sk-fake-pi",
        "models": [{"id": "fake-model", "name": "fake model"}]}}}
    return {".pi/agent/models.json": json.dumps(models)}


def _gemini_settings(base: str) -> dict[str, str]:
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False}}
    return {".gemini/settings.json": json.dumps(settings)}


def _codex_args(base: str) -> list[str]:
    provider = (f'model_providers.fake={{name="fake",base_url="{base}/v1",'
                'env_key="OPENAI_API_KEY",wire_api="responses"}')
    return ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-c", "model_provider=fake", "-c", "model=fake-model", "-c", provider, PROMPT]


AGENTS = {
    "claude": Agent(
        "claude",
        lambda base: ["-p", PROMPT, "--allowedTools", "Bash", "--model", "claude-sonnet-4-5"],
        lambda base: {"ANTHROPIC_API_KEY": "sk-ant-fake", "ANTHROPIC_BASE_URL": base,
                      "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        telemetry=("api.anthropic.com", "statsig.anthropic.com", "*.anthropic.com",
                   "*.sentry.io", "*.datadoghq.com", "*.growthbook.io")),
    "codex": Agent(
        "codex", _codex_args, lambda base: {"OPENAI_API_KEY": "sk-fake-codex"},
        telemetry=("api.openai.com", "chatgpt.com", "*.chatgpt.com", "auth.openai.com",
                   "*.openai.com", "*.sentry.io")),
    "pi": Agent(
        "pi", lambda base: ["-p", "--provider", "fake", "--model", "fake-model", PROMPT],
        lambda base: {}, _pi_models, telemetry=("*.posthog.com", "*.sentry.io")),
    "gemini": Agent(
        "gemini", lambda base: ["-p", PROMPT, "--yolo", "-m", "gemini-2.5-flash"],
        lambda base: {"GEMINI_API_KEY": "fake-gemini-key", "GOOGLE_GEMINI_BASE_URL": base,
                      "GEMINI_CLI_TRUST_WORKSPACE": "true"},
        _gemini_settings,
        telemetry=("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com",
                   "oauth2.googleapis.com", "play.googleapis.com", "*.googleapis.com",
                   "*.google.com", "*.clearcut.dev")),
}


def installed() -> Path:
    """The agents' folder, or fail (CI) / skip: ``make test-agents`` installs them."""
    bindir = AGENTS_DIR / "node_modules" / ".bin"
    missing = [a for a in AGENTS if not (bindir / a).exists()]
    need(not missing, f"agents not installed in {AGENTS_DIR} ({', '.join(missing)}): run "
         "'make test-agents'")
    return AGENTS_DIR


def readable_copy(src: Path, dest: Path) -> Path:
    """The agents where the test user can read them: hard links (one file system), else a
    copy.  CI's checkout may sit in a folder other users cannot enter."""
    if dest.exists():
        return dest
    done = subprocess.run(["cp", "-al", str(src), str(dest)], capture_output=True)
    if done.returncode != 0:
        shutil.copytree(src, dest, symlinks=True)
    os.chmod(dest, 0o755)
    return dest


def agents_for(who: Identity, shared: Path) -> Path:
    """The agents' folder for ``who``: scripts/test-agents already hands over a readable
    mirror (CORRAL_AGENTS_DIR); run by hand on .agents/, the test user gets a copy."""
    src = installed()
    if who.is_root or not IS_ROOT or "CORRAL_AGENTS_DIR" in os.environ:
        return src
    return readable_copy(src, shared / "agents")


__all__ = ["AGENTS", "CI", "Agent", "agents_for", "installed", "readable_copy"]
