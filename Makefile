# corral: the two commands a new user needs are 'make demo' and 'make test'.
# Both install what is missing first: system packages (bubblewrap, libseccomp) through
# scripts/ensure-system, then corral itself into .venv in this checkout.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup system demo test test-agents check bench clean

setup: system $(VENV)/.installed

system:
	@PYTHON=$(PYTHON) scripts/ensure-system

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "corral needs Python 3.11 or newer: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	@# The optional extras too: the tests run mcp, batch with its progress display, serve and Ray.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,mcp,progress,serve,ray]'
	@# Bytecode now: with PYTHONDONTWRITEBYTECODE set, every start would recompile corral.
	$(BIN)/python -m compileall -q src/corral
	@touch $@

demo: setup
	@scripts/demo

test: setup
	$(BIN)/pytest

# The real agents (pi, Claude Code, Codex, Gemini CLI) from the npm registry, cached in
# .agents/, under corral against a fake model server on 127.0.0.1: see docs/agents.md.
test-agents: setup
	@BIN=$(BIN) scripts/test-agents

check: setup
	scripts/check

bench: setup
	$(BIN)/python -m compileall -q src/corral
	$(BIN)/python bench/launch.py --write
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/egress.py --write
	$(BIN)/python bench/seccomp.py
	$(BIN)/python bench/probe.py
	$(BIN)/python bench/disk.py --write
	$(BIN)/python bench/scale.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
