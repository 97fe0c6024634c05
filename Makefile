# Two commands do all the set-up on a fresh machine: `make reproduce` and `make test`.
# The dev set-up installs the ray extra too (about 80 MB): `make test` runs the Ray executor's tests.
# Both create .venv if missing, install torch pinned (never a bare `torch`: on a machine without
# one pip would resolve a multi-GB CUDA build), then the package; the second run is quick.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= quick
OUT    ?= runs/reproduce-$(PROFILE)
# make test-vision: a second env with torchvision and timm, for convert() on their models (tests/vision).
# torchvision pins its torch: this one is PyPI's default build of torch 2.14.1 (CUDA; it runs on the CPU).
VISION_VENV  ?= .venv-vision
VISION_TORCH ?= torch==2.14.1 torchvision==0.29.1 timm==1.0.31
VISION_PY    := $(VISION_VENV)/bin/python
VISION_STAMP := $(VISION_VENV)/.installed
DOCS_STAMP   := $(VENV)/.docs-installed

.PHONY: reproduce test test-fast test-kill test-vision gpu-check gpu-check-here lint bench docs clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,ray]"  # ray: the Ray executor's tests (tests/train/test_executor_ray.py)
	@touch $(STAMP)

reproduce: $(STAMP)
	$(VENV)/bin/gatepool reproduce --profile $(PROFILE) --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)  # everything not marked slow (no trainings, timed runs or subprocesses)
	$(PY) -m pytest -m "not slow"

test-kill: $(STAMP)  # reproduce --profile quick killed ≥ 20 times, against an uninterrupted run (minutes)
	$(PY) -m pytest -m kill --timeout=1800

$(VISION_PY):
	$(PYTHON) -m venv $(VISION_VENV)

$(VISION_STAMP): pyproject.toml | $(VISION_PY)
	$(VISION_PY) -m pip install -q $(VISION_TORCH)
	$(VISION_PY) -m pip install -q -e ".[dev,vision]"
	@touch $(VISION_STAMP)

test-vision: $(VISION_STAMP)  # convert() and the probe on torchvision's and timm's models, the layers (Triton
	# kernels under TRITON_INTERPRET=1 included) on a second torch, the docs' code blocks (README's included),
	# and the benches' quiet output on the CUDA build
	$(VISION_PY) -m pytest -m "not kill" tests/vision tests/layers tests/analysis/test_probe_fx.py \
		tests/test_docs.py tests/lab/test_bench_quiet.py

gpu-check: $(VISION_STAMP)  # on a machine with a CUDA device: the GPU tests, then bench pool there (JSON)
	$(MAKE) gpu-check-here GPU_PY=$(VISION_PY)

# The same checks with GPU_PY (default: the machine's own python3 and torch) and the package from src/, no
# install: for a lent GPU machine without a package registry, where .venv-vision cannot be built. Where
# pytest-xdist is installed the Triton tests' compiles spread over the cores (one by one, 17 of the 63 took
# 210 s on an H200; 14 workers ran them all in 70 s).
GPU_PY ?= python3
gpu-check-here:
	PYTHONPATH=src $(GPU_PY) -m pytest $(shell $(GPU_PY) -c "import xdist" 2>/dev/null && echo "-n auto") \
		tests/layers/test_triton_pool.py
	PYTHONPATH=src $(GPU_PY) -m pytest -m gpu tests
	@mkdir -p runs/gpu-check
	PYTHONPATH=src $(GPU_PY) -m gatepool bench pool --device cuda --json > runs/gpu-check/bench-pool.json
	@echo "wrote runs/gpu-check/bench-pool.json"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

bench: $(STAMP)
	$(VENV)/bin/gatepool bench train
	$(VENV)/bin/gatepool bench pool
	$(VENV)/bin/gatepool bench attention

$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"  # torch is already pinned by $(STAMP)
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)  # the site (docs/, mkdocs.yml) into site/; a broken link, anchor or API warning fails it
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean-venv:
	rm -rf $(VENV)
