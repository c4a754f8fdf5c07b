# Two commands: `make demo` (main job) and `make test` (test suite).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU PyTorch is pinned first so no dependency pulls a CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test install install-test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e ".[test,pretrained]"

demo: install
	$(BIN)/posenc --import experiments/accumulated/claims.py compare --preset default

test: install-test
	$(BIN)/python -m pytest -m "slow or not slow"

clean:
	rm -rf $(VENV) runs
