# Every target sets itself up on a fresh machine: it creates .venv and installs what it needs.
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow test-gpu lint bench assets clean browser

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 first: that release is the CPU build (a bare `torch` would pull a multi-GB CUDA build). Then the
# test-only reference implementations (k-diffusion's samplers and what its sampling module imports), with --no-deps
# so that nothing can replace the CPU torch (about 1 s and 1.4 MB).
$(STAMP): $(BIN)/python pyproject.toml requirements-test-reference.txt
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plot]'
	$(BIN)/pip install -q --no-deps -r requirements-test-reference.txt
	touch $(STAMP)

run: $(STAMP)  ## the main job: every landed method beside its baselines, an HTML report in out/demo/index.html
	$(BIN)/steerdiff demo --out out/demo

# The demo's browser test loads the report in Debian's chromium: install it when it is missing and we may (root, or
# sudo without a password); otherwise say so (the test then fails, or set STEERDIFF_SKIP_BROWSER=1 to skip it).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ -z "$$STEERDIFF_SKIP_BROWSER" ]; then \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing and cannot be installed here (needs root and apt-get): the browser test will fail;" \
	         "install Debian's chromium, or set STEERDIFF_SKIP_BROWSER=1 to skip that test"; \
	  fi; \
	fi

# -n auto: one pytest-xdist worker per core (the suite takes about 6 min on 2 cores instead of 9.5 serially; each
# worker keeps one torch thread, tests/conftest.py). `pytest -q` alone still runs it serially.
test: $(STAMP) browser  ## the fast test suite (what CI runs); installs Debian's chromium for the browser test
	$(BIN)/python -m pytest -q -n auto

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-gpu: $(STAMP)  ## the gpu tests and benchmarks/gpu.py on a CUDA machine (scripts/gpu_check.sh)
	PYTHON=$(BIN)/python scripts/gpu_check.sh

lint: $(STAMP)
	$(BIN)/ruff check steerdiff tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/sampler_overhead.py
	$(BIN)/python benchmarks/vs_diffusers.py

assets: $(STAMP)  ## re-create the shipped checkpoints (about 20 min on 2 cores)
	$(BIN)/python scripts/make_assets.py

clean:
	rm -rf $(VENV) out
