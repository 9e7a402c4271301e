# ml-cluster: `make plan` renders the dev stack offline; `make test` runs the whole offline suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STACK  ?= dev
PYTEST_WORKERS ?= 2

.PHONY: setup setup-plan plan test lint bench preview up destroy clean

# Idempotent: re-installs only when pyproject.toml changed.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.plan-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.dev-deps: pyproject.toml $(VENV)/.plan-deps
	$(BIN)/python -m pip install -q -e ".[dev,train]"
	@touch $@

setup-plan: $(VENV)/.plan-deps
setup: $(VENV)/.dev-deps

plan: setup-plan
	$(BIN)/python scripts/plan.py --stack $(STACK)

test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) tests

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy infra workloads

bench: setup
	$(BIN)/python scripts/bench_loader.py --quick
	$(BIN)/python scripts/bench_stage.py

# The real thing: needs the Pulumi CLI, `pulumi login`, and cloud credentials (see docs/operations.md).
preview: setup-plan
	pulumi preview --diff --stack $(STACK)

up: setup-plan
	pulumi up --stack $(STACK)

destroy: setup-plan
	pulumi destroy --stack $(STACK)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
