# The two entry points of the README. Each creates the virtualenv and installs what is missing
# (idempotent: the stamp file is rebuilt only when pyproject.toml changes). No root needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0

.PHONY: demo test test-kubernetes-min lint setup

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

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)
