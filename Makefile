# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create ./.venv and install everything they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench gpu-check clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch first, pinned, so nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,runtime]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pipeoffload

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m pytest -q -m bench -p no:cacheprovider

# On a GPU machine: the CUDA path run and measured with the PyTorch already installed
# there (never installs or downloads torch). Results in gpu-check/ (docs/gpu.md).
GPU_PY ?= python3
GPU_OUT ?= gpu-check
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py --out $(GPU_OUT)

clean:
	rm -rf $(VENV) out runs gpu-check
