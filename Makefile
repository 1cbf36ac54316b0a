# Two commands set everything up from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-gpu lint venv clean

venv: $(STAMP)

# Create the venv, install the CPU build of torch when torch is missing (an unpinned torch
# pulls several GB of CUDA packages), then the project with the extras the two commands need:
# dev (test tools), peers (PyG, spconv, transformers: the equality tests), distributed (Ray),
# train (scikit-learn: the selector's training) and gpu (Triton: its kernels run interpreted
# on the CPU in the tests). Tests of an extra that is absent are skipped.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev,peers,distributed,train,gpu]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fusekit tour --out fusekit-report

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them
# (module fixtures are built once); most of a fresh run is numba compiling kernels, which the
# workers share through numba's on-disk cache.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) tools/loc.py src/fusekit
	$(PY) -m ruff check src tests benchmarks tools
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks tools
	$(PY) -m ruff format --check src tests benchmarks tools

clean:
	rm -rf $(VENV) fusekit-report .pytest_cache

# The tests that need a CUDA device, each file in its own process: the interpreted Triton
# tests set TRITON_INTERPRET for their whole process. On a machine with its own torch and
# Triton: `make test-gpu PY=python3`.
test-gpu:
	for f in $$(grep -rl "mark.gpu" tests); do $(PY) -m pytest -q -m gpu $$f || exit 1; done

