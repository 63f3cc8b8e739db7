# Every target sets itself up on a fresh machine: it creates .venv and installs what it needs.
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 first: that release is the CPU build (a bare `torch` would pull a multi-GB CUDA build).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plot]'
	touch $(STAMP)

run: $(STAMP)  ## the main job on the shipped default
	$(BIN)/steerdiff sample --model gmm2d --method heun --steps 50 --n 2000 --seed 0 --out out/

test: $(STAMP)  ## the fast test suite (what CI runs)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check steerdiff tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/sampler_overhead.py

clean:
	rm -rf $(VENV) out
