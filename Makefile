# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/cadence run configs/quickstart.toml --out runs/quickstart

test: $(STAMP)
	$(BIN)/ruff check cadence tests
	$(BIN)/ruff format --check cadence tests
	$(BIN)/mypy cadence
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/cadence bench pipeline --json

clean:
	rm -rf $(VENV) runs
