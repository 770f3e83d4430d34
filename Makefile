# Every target creates and uses a local virtual environment (.venv) and installs what it
# needs itself. The CPU build of torch is pinned and installed first: a bare `torch`
# requirement on a machine without torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.divrl-installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup test test-verl test-deepspeed test-versions lint format clean bench demo gpu-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# divrl inside upstream verl (docs/verl.md): a venv of its own, since verl pins
# transformers and tensordict below what the core install takes; its tests live in
# tests_verl/, which `make test` does not collect.
VERL_VENV := .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_STAMP := $(VERL_VENV)/.divrl-verl-installed

$(VERL_BIN)/python:
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install --quiet --upgrade pip

$(VERL_STAMP): pyproject.toml | $(VERL_BIN)/python
	$(VERL_BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(VERL_BIN)/pip install --quiet -e ".[verl,test]"
	touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	OMP_WAIT_POLICY=PASSIVE $(VERL_BIN)/python -m pytest -q -p no:cacheprovider tests_verl

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

# Lp-Reg and DPH-RL through TRL under DeepSpeed ZeRO-1/2/3 (tests/integrations/
# test_trl_zero3.py: 2 CPU processes, gloo), which `make test` skips: DeepSpeed is no
# dependency of divrl's. It goes into a folder of its own on PYTHONPATH, not into the venv:
# built without its CUDA/C++ ops (DS_BUILD_OPS=0), with only those of its dependencies the
# venv lacks (torch, numpy, pydantic, psutil, packaging and tqdm come with the venv's install).
DEEPSPEED_SPEC ?= deepspeed==0.19.8
DS_PKGS := .deepspeed-pkgs

$(DS_PKGS)/.installed: | $(STAMP)
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-deps --no-build-isolation --target $(DS_PKGS) \
	  "$(DEEPSPEED_SPEC)" hjson msgpack ninja py-cpuinfo einops
	touch $@

test-deepspeed: $(STAMP) $(DS_PKGS)/.installed
	PYTHONPATH=$(DS_PKGS) OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -p no:cacheprovider \
	  tests/integrations/test_trl_zero3.py

# The fast tests under the lowest torch/transformers pyproject.toml declares and under the
# newest the index serves, each in its own venv (.venv-versions/lowest, /newest). Any torch
# other than the CPU build TORCH_SPEC names is a CUDA build of several GB on PyPI; set
# LOWEST_SPECS / NEWEST_SPECS (pip requirement specs) and VERSIONS_PYTEST (pytest
# arguments) to test other pairs or fewer tests.
LOWEST_SPECS ?= torch==2.11.0 transformers==5.0.0
NEWEST_SPECS ?= torch transformers
VERSIONS_PYTEST ?= -m "not slow"

test-versions:
	@set -e; for pair in "lowest|$(LOWEST_SPECS)|" "newest|$(NEWEST_SPECS)|--upgrade"; do \
	  name=$${pair%%|*}; rest=$${pair#*|}; specs=$${rest%%|*}; upgrade=$${rest#*|}; \
	  venv=.venv-versions/$$name; \
	  [ -x $$venv/bin/python ] || $(PYTHON) -m venv $$venv; \
	  $$venv/bin/pip install --quiet $$upgrade $$specs; \
	  $$venv/bin/pip install --quiet -e ".[test]" $$specs; \
	  $$venv/bin/python -c "import torch, transformers; print('$$name: torch', torch.__version__, 'transformers', transformers.__version__)"; \
	  OMP_WAIT_POLICY=PASSIVE $$venv/bin/python -m pytest -q -p no:cacheprovider $(VERSIONS_PYTEST); \
	done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Performance measurements (not tests): JSON + Markdown under benchmarks/results/.
# Idle OpenMP threads spin-wait by default, which on a shared 2-core machine makes two torch
# threads slower than one: PASSIVE lets them sleep.
bench: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m benchmarks.run_all

# The toy world end to end (GRPO vs DPH-JS vs Lp-Reg vs the base model); see docs/evaluation.md.
demo: $(STAMP)
	$(BIN)/divrl demo

# Wheels of the small dependencies a GPU image without network lacks, into wheels/ (git-ignored):
# carried to the GPU machine for benchmarks/gpu_acceptance.sh (docs/scaling.md).
gpu-wheels: $(STAMP)
	PY=$(BIN)/python bash benchmarks/gpu_wheels.sh wheels

clean:
	rm -rf $(VENV) $(VERL_VENV) $(DS_PKGS) build *.egg-info .pytest_cache .ruff_cache
