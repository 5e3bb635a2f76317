# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create ./.venv and install everything they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

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

clean:
	rm -rf $(VENV) out runs
