# pobo: two-command quickstart -> `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pobo-installed

.PHONY: demo test lint bench bench-perf clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/pobo demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check shared tests || true

bench: $(STAMP)
	$(BIN)/pobo bench synthetic --runs 50 --json bench-synthetic.json --plot bench-synthetic.png

bench-perf: $(STAMP)
	$(BIN)/pobo bench perf --json bench-perf.json

clean:
	rm -rf $(VENV) pobo-demo-output .pytest_cache
