# corral: the two commands a new user needs are 'make demo' and 'make test'.
# Both install what is missing first: system packages (bubblewrap, libseccomp) through
# scripts/ensure-system, then corral itself into .venv in this checkout.

# The interpreter .venv is built on (scripts/pick-python says which, and why).
PYTHON ?= $(shell scripts/pick-python)
VENV   := .venv
BIN    := $(VENV)/bin
INIT   := src/corral/init.bin
INIT_C := src/corral/init.c src/corral/init_config.c src/corral/init_bridge.c src/corral/init_join.c

.PHONY: setup system demo test test-agents check bench clean FORCE

SECCOMP_CACHE := src/corral/seccomp.cache
PROFILES_CACHE := src/corral/profiles.cache

setup: system $(VENV)/.installed $(INIT) $(SECCOMP_CACHE) $(PROFILES_CACHE)

# The seccomp programs compiled once (src/corral/seccache.py): every run checks that the
# file matches this code and this libseccomp, and compiles them itself when it does not.
$(SECCOMP_CACHE): src/corral/seccomp.py src/corral/syscalls.py src/corral/seccache.py $(VENV)/.installed
	@$(BIN)/python -m corral.seccache --write

# The shipped profiles parsed once (src/corral/profcache.py): a profile whose text is not
# in it, edited or a user's, is parsed by tomllib as before.
$(PROFILES_CACHE): $(wildcard src/corral/profiles/*.toml) src/corral/profcache.py $(VENV)/.installed
	@$(BIN)/python -m corral.profcache --write

# corral's compiled init (src/corral/cinit.py), with the system's C compiler; without one,
# scripts/build-init says so and runs use the Python init (same checks, slower start).
$(INIT): $(INIT_C) src/corral/init.h scripts/build-init
	@scripts/build-init $@ $(INIT_C)

system:
	@PYTHON=$(PYTHON) scripts/ensure-system

# .venv is made again when PYTHON names another interpreter than the one it was made with.
$(VENV)/.python: FORCE
	@[ "$$(cat $@ 2>/dev/null)" = "$(PYTHON)" ] || { mkdir -p $(VENV) && echo "$(PYTHON)" > $@; }

$(VENV)/.installed: pyproject.toml $(VENV)/.python
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "corral needs Python 3.11 or newer: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv --clear $(VENV)
	@echo "$(PYTHON)" > $(VENV)/.python
	@# The optional extras too: the tests run mcp, batch with its progress display, serve and Ray.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,mcp,progress,serve,ray]'
	@# corral's commands with -I and -S, over pip's (scripts/console-scripts says why).
	$(BIN)/python scripts/console-scripts $(BIN)
	@# Bytecode now: with PYTHONDONTWRITEBYTECODE set, every start would recompile corral.
	$(BIN)/python -m compileall -q src/corral
	@touch $@

demo: setup
	@scripts/demo

# Two pytest sessions side by side, then the few tests that need the machine alone
# (scripts/run-tests says why); '$(BIN)/pytest' runs the same tests in one session.
test: setup
	$(BIN)/python scripts/run-tests

# The real agents (pi, Claude Code, Codex, Gemini CLI) from the npm registry, cached in
# .agents/, under corral against a fake model server on 127.0.0.1: see docs/agents.md.
test-agents: setup
	@BIN=$(BIN) scripts/test-agents

check: setup
	scripts/check

bench: setup
	$(BIN)/python -m compileall -q src/corral
	$(BIN)/python bench/launch.py --write
	$(BIN)/python bench/floor.py --write
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/egress.py --write
	$(BIN)/python bench/seccomp.py
	$(BIN)/python bench/probe.py
	$(BIN)/python bench/disk.py --write
	$(BIN)/python bench/scale.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(SECCOMP_CACHE) $(PROFILES_CACHE)
