# Two commands from a fresh clone, with Python 3.11 and make on the machine:
#     make run    set up .venv if it is missing, then run the main job (A2C on remote actors)
#     make test   set up .venv if it is missing, then run the fast test suite
# `make slow` runs the slow suite (agents trained to their thresholds), `make docs` builds the
# documentation site into site/. The set-up installs requirements-dev.txt (every distribution
# editable, with constraints.txt's pins) into .venv; TORCH_INDEX_URL, where set, is the wheel
# index torch's CPU build is installed from first (PyTorch's CPU-only index: its install
# selector gives the address), since a plain install of the pin can fetch the CUDA build.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_INDEX_URL ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := requirements-dev.txt constraints.txt $(wildcard packages/*/pyproject.toml apps/*/pyproject.toml)

.PHONY: run test slow docs setup

run: $(STAMP)
	$(BIN)/python examples/a2c_parallel/train.py

test: $(STAMP)
	$(BIN)/python -m pytest --durations=25

slow: $(STAMP)
	$(BIN)/python -m pytest -m slow --durations=25

docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict

setup: $(STAMP)

$(STAMP): $(SOURCES)
	@test -n "$(PYTHON)" || { echo "make: no python3.11 on PATH: install Python 3.11, or give PYTHON=/path/to/python3.11" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX_URL),$(BIN)/python -m pip install --quiet -c constraints.txt torch --index-url $(TORCH_INDEX_URL))
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)
