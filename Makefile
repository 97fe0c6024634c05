# Two commands do all the set-up on a fresh machine: `make reproduce` and `make test`.
# The dev set-up installs the ray extra too (about 80 MB): `make test-slow` runs the Ray executor's tests.
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

.PHONY: reproduce test test-slow test-kill test-vision gpu-check gpu-check-here lint bench docs clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,ray]"  # ray: the Ray executor's tests (tests/train/test_executor_ray.py)
	@touch $(STAMP)

reproduce: $(STAMP)
	$(VENV)/bin/gatepool reproduce --profile $(PROFILE) --out $(OUT)

# The tests' pytest workers (pytest-xdist), each at one torch and OpenMP thread (tests/conftest.py): on 2
# cores a run takes about half its one-process time; TEST_WORKERS=1 runs it in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

test: $(STAMP)  # every test not marked slow (CI runs test-slow after it)
	$(PY) -m pytest $(XDIST) -m "not slow and not kill"

test-slow: $(STAMP)  # the slow ones: trainings, quick experiment runs, builds, subprocesses, DDP and Ray, the docs
	$(PY) -m pytest $(XDIST) -m "slow and not kill"

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

gpu-check: $(VISION_STAMP)  # on a machine with a CUDA device: the GPU tests, then bench pool and bench step there
	$(MAKE) gpu-check-here GPU_PY=$(VISION_PY)

# The same checks with GPU_PY (default: the machine's own python3 and torch) and the package from src/, no
# install: for a lent GPU machine without a package registry, where .venv-vision cannot be built. Where
# pytest-xdist is installed the Triton tests' compiles spread over the cores (one by one, 17 of the 63 took
# 210 s on an H200; 14 workers ran them all in 70 s). Each part has its own time limit (seconds, beside it:
# 480 s in all, so the whole check ends within 8 minutes), a part that fails or runs out of time does not
# stop the next, and the recipe fails at the end if any did. The JSON goes to runs/gpu-check/: bench pool
# in three records (float32, the stem's bf16, the tiny input) so that one that runs out of time leaves the
# others (bench step, stopped by its limit's SIGTERM, saves what it timed); bench step on ResNet-50 at 224, batch 128, eager and compiled, the max-pool net against soft and
# attention (the gates with step targets), 10 steps after 2 warm-up, no compile started after 110 s
# (a ResNet-50's first compile takes about a minute; the later ones reuse its kernels).
GPU_PY ?= python3
GPU_OUT ?= runs/gpu-check
GPU_BENCH := env PYTHONPATH=src $(GPU_PY) -m gatepool bench
gpu-check-here:
	@mkdir -p $(GPU_OUT); failed=""; \
	part() { limit=$$1; name=$$2; shift 2; echo "== $$name (at most $$limit s): $$*"; \
		timeout -k 10 $$limit "$$@" || { echo "== $$name: FAILED (exit $$?; 124: out of time)"; failed="$$failed $$name"; }; }; \
	part 110 triton-tests env PYTHONPATH=src $(GPU_PY) -m pytest -q \
		$$($(GPU_PY) -c "import xdist" 2>/dev/null && echo "-n auto") tests/layers/test_triton_pool.py; \
	part 50 gpu-tests env PYTHONPATH=src $(GPU_PY) -m pytest -q -m gpu tests; \
	part 60 bench-pool $(GPU_BENCH) pool --device cuda --cases tiled,overlapping \
		--out $(GPU_OUT)/bench-pool.json; \
	part 50 bench-pool-stem $(GPU_BENCH) pool --device cuda --cases stem-tiled,stem-overlapping \
		--out $(GPU_OUT)/bench-pool-stem.json; \
	part 30 bench-pool-tiny $(GPU_BENCH) pool --device cuda --cases tiny-tiled,tiny-overlapping \
		--out $(GPU_OUT)/bench-pool-tiny.json; \
	part 180 bench-step $(GPU_BENCH) step --device cuda --gates soft,attention --steps 10 \
		--warmup 2 --budget 110 --out $(GPU_OUT)/bench-step.json; \
	ls -l $(GPU_OUT); \
	if [ -n "$$failed" ]; then echo "gpu-check: failed or out of time:$$failed"; exit 1; fi

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
