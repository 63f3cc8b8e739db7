# Every target sets itself up on a fresh machine: it creates .venv and installs what it needs.
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow lint bench assets clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 first: that release is the CPU build (a bare `torch` would pull a multi-GB CUDA build).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plot]'
	touch $(STAMP)

run: $(STAMP)  ## the main job: every landed method beside its baselines, an HTML report in out/demo/index.html
	$(BIN)/steerdiff demo --out out/demo

test: $(STAMP)  ## the fast test suite (what CI runs)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check steerdiff tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/sampler_overhead.py
	$(BIN)/python benchmarks/vs_diffusers.py

assets: $(STAMP)  ## re-create the shipped checkpoints (about 20 min on 2 cores)
	$(BIN)/python scripts/make_assets.py

clean:
	rm -rf $(VENV) out
