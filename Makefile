# pobo: two-command quickstart -> `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pobo-installed

.PHONY: demo test bytecode lint docs lock bench bench-perf bench-ldp bench-gibo bench-fed clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# `make demo ARGS=--keep-running` keeps both services and their browser consoles up until Ctrl-C.
demo: $(STAMP) bytecode
	$(BIN)/pobo demo $(ARGS)

# One BLAS thread per process: the suite runs many small linear-algebra calls beside live servers on a
# 2-core machine, where OpenBLAS's spinning threads slow it down several-fold. Two pytest-xdist workers, a
# test file at a time each (most tests wait on services or the database, so two share two cores well);
# `make test TEST_WORKERS=0` runs in one process.
TEST_WORKERS ?= 2
test: $(STAMP) bytecode
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# pobo's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) every
# process would otherwise compile them from source at each start, ~0.25 s of CPU for each of the hundreds of
# service processes the tests start. (Reading .pyc files is not affected by the variable; only writing is.)
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 shared curator_service modeler_service pobo migrations tests

lint: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared curator_service modeler_service pobo

docs: $(STAMP)
	$(BIN)/pobo docs api

# constraints.txt, the image's lock file: every run-time dependency (transitive ones too) at the version a
# fresh virtualenv with pobo alone resolves today, with the Python the image uses (python3.11). Review the
# diff, rebuild the image, run the tests.
LOCK_VENV := $(or $(TMPDIR),/tmp)/pobo-lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q .
	sed -n '/^#/p' constraints.txt > constraints.txt.new
	$(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | grep -v -i -E '^pobo( |@|==)' >> constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)

bench: $(STAMP)
	$(BIN)/pobo bench synthetic --runs 50 --json bench-synthetic.json --plot bench-synthetic.png

bench-perf: $(STAMP)
	$(BIN)/pobo bench perf --json bench-perf.json

bench-ldp: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/pobo bench ldp --runs 10 --json bench-ldp.json --plot bench-ldp.png

bench-gibo: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/pobo bench gibo --json bench-gibo.json --plot bench-gibo.png

bench-fed: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/pobo bench fed --json bench-fed.json --plot bench-fed.png

clean:
	rm -rf $(VENV) pobo-demo-output .pytest_cache
