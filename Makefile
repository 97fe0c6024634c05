# Two commands do all the set-up on a fresh machine: `make reproduce` and `make test`.
# Both create .venv if missing, install torch pinned (never a bare `torch`: on a machine without
# one pip would resolve a multi-GB CUDA build), then the package; the second run is quick.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= quick
OUT    ?= runs/reproduce-$(PROFILE)

.PHONY: reproduce test test-fast test-kill lint bench clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

reproduce: $(STAMP)
	$(VENV)/bin/gatepool reproduce --profile $(PROFILE) --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)  # everything not marked slow (no trainings, timed runs or subprocesses)
	$(PY) -m pytest -m "not slow"

test-kill: $(STAMP)  # reproduce --profile quick killed ≥ 20 times, against an uninterrupted run (minutes)
	$(PY) -m pytest -m kill --timeout=1800

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

bench: $(STAMP)
	$(VENV)/bin/gatepool bench train
	$(VENV)/bin/gatepool bench pool
	$(VENV)/bin/gatepool bench attention

clean-venv:
	rm -rf $(VENV)
