# The two entry points of the README. Each creates the virtualenv and installs what is missing
# (idempotent: the stamp file is rebuilt only when pyproject.toml changes). No root needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0

.PHONY: demo test lint setup

demo: $(STAMP)
	$(BIN)/elastic run examples/demo-crash.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)
