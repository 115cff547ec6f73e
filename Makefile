# `make test` and `make demo` each set themselves up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned to the CPU build; then kdsl with its extras (which repeat the same pin).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff format --check kdsl tests
	$(BIN)/ruff check kdsl tests
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/kdsl demo

lint: $(STAMP)
	$(BIN)/ruff format kdsl tests
	$(BIN)/ruff check --fix kdsl tests

clean:
	rm -rf $(VENV) build *.egg-info
