# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create ./.venv and install everything they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install chromium bench gpu-check clean

# Extra pytest arguments for `make test` (.ci/run passes --durations=25).
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`, each module whole on one worker (--dist loadscope), so a
# module's spawned world is built once (loadgroup's marks are not applied under pytest 9 and split
# those modules over both workers). PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2

$(STAMP): pyproject.toml setup.py src/pipeoffload/_engine.c $(wildcard src/pipeoffload/engine_c/*.c)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch first, pinned, so nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,runtime,solver,hf]'
	# Bytecode for every module, as a wheel install writes it (an editable install does not, and
	# with PYTHONDONTWRITEBYTECODE set every command would compile the package again).
	$(BIN)/python -m compileall -q src/pipeoffload
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pipeoffload

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

chromium:
	@# The browser tests need Chromium from the system's packages: install it when missing (root or passwordless sudo).
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { s=; [ "$$(id -u)" = 0 ] || s="sudo -n"; \
	  if command -v apt-get >/dev/null && { [ -z "$$s" ] || sudo -n true 2>/dev/null; }; then \
	    echo "make test: installing Chromium for the browser tests (apt-get install chromium)"; \
	    { $$s env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	      { $$s apt-get update -qq >/dev/null 2>&1 && \
	        $$s env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; } || \
	    echo "make test: could not install Chromium; the browser tests (tests/test_html.py) will fail"; \
	  else echo "make test: Chromium is missing and cannot be installed here (needs apt-get as root or passwordless sudo);" \
	    "the browser tests (tests/test_html.py) will fail. Install it with: sudo apt-get install chromium"; fi; }

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
