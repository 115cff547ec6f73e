# `make test` and `make demo` each set themselves up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo docs lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned to the CPU build; then kdsl with its extras (which repeat the same pin).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# the docs' headless-browser test needs Chromium: installed here when apt-get can (never fails; else it skips)
test: $(STAMP)
	-sh scripts/ensure_browser.sh
	$(BIN)/ruff format --check kdsl tests
	$(BIN)/ruff check kdsl tests
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q

# The tour of the gallery, then the main job for 4.5 minutes on the embedded defaults
# (local executor, SQLite); re-running resumes it.
demo: $(STAMP)
	$(BIN)/kdsl demo
	$(BIN)/kdsl discover --net proxy-resnet --spec conv2d --max-macs 0.5x --time-limit 270 \
		--workers 2 --db out/demo/runs.sqlite --out out/demo
	@echo "results: out/demo/results.md (ranked table), out/demo/pareto.png, out/demo/pages/"

# the guide (docs/guide), the API reference and the gallery as one static site: out/docs/index.html
docs: $(STAMP)
	$(BIN)/kdsl docs build --out out/docs

lint: $(STAMP)
	$(BIN)/ruff format kdsl tests
	$(BIN)/ruff check --fix kdsl tests

clean:
	rm -rf $(VENV) build *.egg-info
