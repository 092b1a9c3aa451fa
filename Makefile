# Two commands on a fresh clone: `make demo` (the quick tour) and `make test` (the test suite).
# Both create .venv if it is missing and install the package with its dev and rl extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch; on a CUDA machine run e.g. `make TORCH=torch test` or install torch first.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,rl]"
	touch $(STAMP)

# THREADS: torch threads (default: half the cores, one on 2 cores; see docs/training.md, "Threads").
THREADS ?=

demo: $(STAMP)
	$(BIN)/chronomem run tour $(if $(THREADS),--threads $(THREADS))  # writes runs/tour (runs/tour-2, ... later: nothing is overwritten)

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/chronomem bench --out runs/bench/$$(date +%Y%m%d-%H%M%S)  # a new directory per run: bench never overwrites one

clean:
	rm -rf $(VENV) runs .pytest_cache
