"""The vLLM engine as a `TurnEngine`, with vLLM itself faked at its edge (`vllm.LLM` and the engine it
steps, `SamplingParams`, `TokensPrompt`): its positions are the ones vLLM was built with, a call's token
limit reaches every request while each sample keeps its single-turn request and seed, and
guess-the-number episodes played on it are its ids and the environment's, token in, token out. The
real engine: `tests/vllm/test_vllm_episodes.py`."""

from __future__ import annotations

import asyncio
import random
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cadence.config import RunConfig, VllmConfig
from cadence.launch.build import make_tokenizer
from cadence.model.engine import SamplingParams, sample_seed
from cadence.model.rollout_engine import TurnEngine
from cadence.model.turns import ChatTurns
from cadence.model.vllm_engine import VllmEngine
from cadence.rollout.play import EngineGenerate, play
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.guess import GuessNumber
from cadence.tasks.environments.runner import EpisodeRunner
from tests.conftest import tiny_config
from tests.turns import RecordingTurns, check_episode

MODEL_POSITIONS = 256  # the model's own, which vLLM plans for without vllm.max_model_len


@dataclass(frozen=True)
class FakeSampling:
    """`vllm.SamplingParams`, the keywords the engine gives it."""

    n: int
    seed: int
    temperature: float
    top_p: float
    max_tokens: int
    logprobs: int
    stop_token_ids: list[int]
    detokenize: bool
    output_kind: str


@dataclass(frozen=True)
class FakePrompt:
    """`vllm.TokensPrompt`."""

    prompt_token_ids: list[int]


class FakeLLMEngine:
    """`vllm.LLM.llm_engine` as the engine steps it: a request is sampled when added (`sample`) and
    finishes at the next step."""

    def __init__(self, sample: Callable[[list[int], FakeSampling], Any]) -> None:
        self.sample = sample
        self.queued: dict[str, Any] = {}

    def add_request(self, request_id: str, prompt: FakePrompt, params: FakeSampling) -> None:
        assert request_id not in self.queued
        self.queued[request_id] = self.sample(prompt.prompt_token_ids, params)

    def has_unfinished_requests(self) -> bool:
        return bool(self.queued)

    def step(self) -> list[Any]:
        done = [
            SimpleNamespace(request_id=i, finished=True, outputs=o.outputs) for i, o in self.queued.items()
        ]
        self.queued.clear()
        return done

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            del self.queued[request_id]


class FakeLLM:
    """`vllm.LLM` as the engine uses it: each request sampled from its seed alone, over `IDS`, until a
    stop id or `max_tokens` (or the positions are full); a prompt that leaves no position for an output
    token is refused, as vLLM refuses it."""

    IDS: list[int] = []

    def __init__(self, model: str, *, max_model_len: int | None, **settings: Any) -> None:
        self.settings = settings
        self.model_config = SimpleNamespace(max_model_len=max_model_len or MODEL_POSITIONS)
        self.requests: list[tuple[list[int], FakeSampling]] = []
        self.llm_engine = FakeLLMEngine(self._one)
        self.renderer = SimpleNamespace(render_cmpl=list)  # a prompt of token ids is its own input

    def _one(self, prompt: list[int], params: FakeSampling) -> Any:
        positions = self.model_config.max_model_len
        if len(prompt) >= positions:
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in {positions} positions")
        self.requests.append((list(prompt), params))
        rng = random.Random(params.seed)
        tokens: list[int] = []
        logprobs: list[dict[int, Any]] = []
        while len(tokens) < params.max_tokens and len(prompt) + len(tokens) < positions:
            token = rng.choice(self.IDS)
            tokens.append(token)
            logprobs.append({token: SimpleNamespace(logprob=-rng.random())})
            if token in params.stop_token_ids:
                break
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs)])


@pytest.fixture
def cfg() -> RunConfig:
    return tiny_config(
        "environment.name='guess_number'",
        f"model.max_position={MODEL_POSITIONS}",
        "environment.max_tokens=150",
        "environment.max_turn_tokens=6",
        "environment.max_turns=8",
    )


@pytest.fixture(autouse=True)
def fake_vllm(monkeypatch: pytest.MonkeyPatch, cfg: RunConfig) -> None:
    """`import vllm` gives the fake; the variables the engine sets on import are put back after (set,
    then deleted: each step recorded, so undone in turn)."""
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM  # type: ignore[attr-defined]
    module.SamplingParams = FakeSampling  # type: ignore[attr-defined]
    module.TokensPrompt = FakePrompt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    kinds = SimpleNamespace(FINAL_ONLY="final only")
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", SimpleNamespace(RequestOutputKind=kinds))
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    tokenizer = make_tokenizer(cfg)
    monkeypatch.setattr(FakeLLM, "IDS", [*tokenizer.encode("0123456789 x"), tokenizer.eos_id])


def engine(cfg: RunConfig, max_model_len: int = 0, max_new_tokens: int = 9) -> VllmEngine:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.7, top_p=1.0)
    eos = make_tokenizer(cfg).eos_id
    return VllmEngine(Path("model"), eos, params, VllmConfig(max_model_len=max_model_len), cfg.seed)


def fake(vllm: VllmEngine) -> FakeLLM:
    assert isinstance(vllm.llm, FakeLLM)
    return vllm.llm


def test_the_vllm_engine_is_a_turn_engine_with_the_positions_vllm_was_built_with(cfg: RunConfig) -> None:
    planned = engine(cfg, max_model_len=200)
    assert isinstance(planned, TurnEngine)
    assert planned.max_context == 200 and EngineGenerate(planned).max_context == 200
    assert engine(cfg).max_context == MODEL_POSITIONS  # vllm.max_model_len = 0: the model's own


def test_a_calls_token_limit_reaches_every_request_and_each_sample_keeps_its_seed(cfg: RunConfig) -> None:
    vllm = engine(cfg)
    tokenizer = make_tokenizer(cfg)
    groups = [(tokenizer.encode_prompt("12"), [11, 12, 13]), (tokenizer.encode_prompt("3"), [14])]
    single = vllm.generate_many(groups)
    limited = vllm.generate_many(groups, max_new_tokens=3)
    cooler = vllm.generate_many(groups, temperature=0.0, max_new_tokens=4)
    requests = fake(vllm).requests
    assert len(requests) == 12
    first, second, third = requests[:4], requests[4:8], requests[8:]
    assert [s.seed for _, s in first] == [11, 12, 13, 14] and {s.max_tokens for _, s in first} == {9}
    for (prompt, alone), (p2, short), (p3, cool) in zip(first, second, third, strict=True):
        assert prompt == p2 == p3
        assert short == replace(alone, max_tokens=3)  # the same request, its limit the call's
        assert cool == replace(alone, max_tokens=4, temperature=0.0)
    for whole, cut in zip(single, limited, strict=True):
        for a, b in zip(whole, cut, strict=True):
            assert len(b.tokens) <= 3 and b.tokens == a.tokens[: len(b.tokens)]
            assert b.logprobs == a.logprobs[: len(b.tokens)]
            assert b.finished == (b.tokens[-1] == tokenizer.eos_id)
    assert [len(g) for g in cooler] == [3, 1]
    assert vllm.generate_many(groups, max_new_tokens=None) == single  # None: the engine's own limit


def test_episodes_on_the_vllm_engine_are_its_ids_and_the_environments(cfg: RunConfig) -> None:
    positions = 182  # guess-the-number's first message (140 to 142 ids), then room for a few turns
    vllm = RecordingTurns(engine(cfg, max_model_len=positions))
    tokenizer = make_tokenizer(cfg)
    codec = ChatTurns(tokenizer)
    e = cfg.environment
    bounds = Bounds(e.max_turns, e.max_tokens, e.max_turn_tokens)
    runner = EpisodeRunner(GuessNumber, EngineGenerate(vllm, 0.5), codec, bounds)
    groups = []
    for prompt_id in (3, 8):
        prompt = Prompt(prompt_id, f"game {prompt_id}", "")
        groups.append((prompt, [sample_seed(cfg.seed, 0, prompt_id, i) for i in range(4)], [0]))
    made = asyncio.run(play(runner, groups, tokenizer.eos_id))
    endings = set()
    turns = []
    for (_, seeds, _), group in zip(groups, made, strict=True):
        figures = group.episodes
        assert figures is not None and figures.transcripts
        assert group.prompt == tokenizer.encode_prompt(figures.transcripts[0][0])
        for i, seed in enumerate(seeds):
            check_episode(
                vllm,
                seed,
                group.prompt,
                group.completions[i],
                group.masks[i],
                group.logprobs[i],
                figures.transcripts[i],
                codec,
                e.max_turn_tokens,
            )
            assert figures.turns[i] == len(figures.transcripts[i]) // 2
            endings.add(figures.endings[i])
        turns += figures.turns
    assert max(turns) >= 2 and "context" in endings and endings <= {"context", "done"}
    # every request vLLM got fits its positions: the runner asks no more than the context leaves
    assert isinstance(vllm.engine, VllmEngine)
    for ids, params in fake(vllm.engine).requests:
        assert len(ids) + params.max_tokens <= positions and params.max_tokens <= e.max_turn_tokens
        assert params.temperature == 0.5  # the caller's
