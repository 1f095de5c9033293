"""Multi-turn episodes on the vLLM engine: a rollout worker with guess-the-number (`environment.name`), a
real publisher and the tiny random Llama of the other vLLM tests, the test playing dispatcher and
trainer. Token in, token out: each completion the trainer receives is exactly what vLLM sampled turn by
turn and the environment's message ids between, the mask 1 on the sampled ids alone, each turn within
its token limit and vLLM's positions (`vllm.max_model_len`), and a forward of cadence's own model over
the final ids gives vLLM's log-prob at every sampled token."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from cadence.actors.rollout import RolloutWorker
from cadence.config import RunConfig
from cadence.launch.build import make_model, make_tokenizer, vocab_limit
from cadence.launch.settings import group_bounds
from cadence.model.checkpoint import state_dict_to_bytes
from cadence.model.engine import sample_seed
from cadence.model.hf_state import hf_state_dict
from cadence.model.rollout_engine import TurnEngine
from cadence.model.transformer import Transformer
from cadence.model.turns import ChatTurns
from cadence.model.vllm_engine import VllmEngine
from cadence.transport.inproc import InprocNetwork, InprocServer
from cadence.wire.meaning import group_problem
from cadence.wire.messages import (
    Assignment,
    GroupResult,
    decode_frames,
    encode_frames,
)
from tests.conftest import episodes_of, expect, tiny_config
from tests.turns import RecordingTurns, check_episode
from tests.vllm.helpers import VLLM_MARKS, module_engine
from tests.vllm.test_vllm_engine import SHAPE, random_model, teacher_forced
from tests.worker_rig import welcomed_worker

pytestmark = [*VLLM_MARKS, pytest.mark.timeout(600)]

POSITIONS = 182  # vLLM's: guess-the-number's first message (140 to 142 ids here), then a few turns
TURN_TOKENS = 6
TEMPERATURE = 0.7
EPISODES = (
    "rollout.engine='vllm'",
    "vllm.kv_cache_mib=64",
    *SHAPE,
    "model.max_position=256",
    f"vllm.max_model_len={POSITIONS}",
    "environment.name='guess_number'",
    f"environment.max_tokens={POSITIONS - 1}",
    f"environment.max_turn_tokens={TURN_TOKENS}",
    "environment.max_turns=8",
    f"rollout.temperature={TEMPERATURE}",
    "rollout.max_new_tokens=12",
    "monitor.samples_fraction=1.0",  # every group kept: its transcripts travel
    "transport.heartbeat_s=0.2",
    "transport.liveness=300",  # a minute: a loaded host's vLLM turns never look like a lost peer
)


@pytest.fixture(scope="module")
def cfg() -> RunConfig:
    return tiny_config(*EPISODES)


@pytest.fixture(scope="module")
def engine(cfg: RunConfig) -> Iterator[VllmEngine]:
    yield from module_engine(cfg)


@pytest.fixture(scope="module")
def model(cfg: RunConfig) -> Transformer:
    """The weights of version 0: large enough that the model has preferences."""
    return random_model(make_model(cfg, make_tokenizer(cfg))[1], seed=1)


@dataclass
class Rig:
    worker: RolloutWorker
    engine: RecordingTurns  # the module's vLLM engine, each sample it gave kept
    dispatcher: InprocServer
    trainer: InprocServer
    route: bytes  # the worker's, at the dispatcher


@pytest.fixture
async def rig(
    cfg: RunConfig, engine: VllmEngine, model: Transformer, network: InprocNetwork
) -> AsyncIterator[Rig]:
    """A worker on `engine` and a publisher holding `model` as version 0, the worker welcomed."""
    recorded = RecordingTurns(engine)
    weights = state_dict_to_bytes(model)
    async with welcomed_worker(cfg, network, recorded, weights, chunk_bytes=1 << 20, timeout=30) as w:
        yield Rig(w.worker, recorded, w.dispatcher, w.trainer, w.peers["rollout"])


async def test_episodes_on_vllm_are_its_tokens_and_the_environments(
    cfg: RunConfig, rig: Rig, engine: VllmEngine, model: Transformer
) -> None:
    assert isinstance(engine, TurnEngine) and engine.max_context == POSITIONS
    group_size = 4
    await rig.dispatcher.send(rig.route, Assignment(0, 0, 7, "game 7", "", group_size))
    sent = await expect(rig.trainer, GroupResult, timeout=300)
    result = decode_frames(encode_frames(sent, "w0", "test")).message  # as the trainer reads it
    assert isinstance(result, GroupResult)
    tokenizer = rig.worker.maker.tokenizer
    assert group_problem(result, group_bounds(cfg, vocab_limit(cfg, tokenizer))) is None
    assert result.prompt_tokens == tokenizer.encode_prompt(episodes_of(result).transcripts[0][0])
    codec = ChatTurns(tokenizer)
    n = len(result.prompt_tokens)
    for i in range(group_size):
        seed = sample_seed(cfg.seed, 0, 7, i)
        completion, mask, logprobs = result.completions[i], result.masks[i], result.logprobs[i]
        check_episode(
            rig.engine,
            seed,
            result.prompt_tokens,
            completion,
            mask,
            logprobs,
            episodes_of(result).transcripts[i],
            codec,
            TURN_TOKENS,
        )
        # the learner's forward over the final ids gives vLLM's log-prob at every sampled token
        ids = result.prompt_tokens + completion
        forward = teacher_forced(model, ids[:1], ids[1:], TEMPERATURE)[n - 1 :]
        sampled = [(lp, f) for lp, f, m in zip(logprobs, forward, mask, strict=True) if m]
        assert [lp for lp, _ in sampled] == pytest.approx([f for _, f in sampled], abs=2e-4)
        # an episode's first turn is the single-turn sample of its seed, cut at the turn's limit
        first = rig.engine.asked[seed].completion
        (alone,) = engine.generate(result.prompt_tokens, [seed])
        assert first.tokens == alone.tokens[: len(first.tokens)]
        assert first.logprobs == pytest.approx(alone.logprobs[: len(first.tokens)], abs=2e-4)
    assert max(episodes_of(result).turns) >= 2 and "context" in episodes_of(result).endings
    assert set(episodes_of(result).endings) <= {"context", "done"}
    assert rig.worker.weights.playing is None and rig.worker.groups_sent == 1


def test_a_calls_token_limit_cuts_each_sample_short_of_the_same_seeds(
    cfg: RunConfig, engine: VllmEngine, model: Transformer
) -> None:
    engine.load_state(hf_state_dict(model))
    prompt = make_tokenizer(cfg).encode_prompt("37")
    groups = [(prompt, list(range(101, 117)))]
    whole = engine.generate_many(groups, max_new_tokens=12)[0]
    cut = engine.generate_many(groups, max_new_tokens=3)[0]
    assert engine.generate_many(groups)[0] == whole  # None: the engine's own limit, rollout.max_new_tokens
    for a, b in zip(whole, cut, strict=True):
        assert 1 <= len(b.tokens) <= 3 and (b.finished or len(b.tokens) == 3)
        assert b.tokens == a.tokens[: len(b.tokens)]
        assert b.logprobs == pytest.approx(a.logprobs[: len(b.tokens)], abs=2e-4)
    assert any(len(a.tokens) > 3 for a in whole)
    # a prompt and a call's limit that fill vLLM's positions exactly are taken
    full = (prompt * POSITIONS)[: POSITIONS - 2]
    for c in engine.generate_many([(full, [1, 2])], max_new_tokens=2)[0]:
        assert len(c.tokens) == 2 or c.finished


def test_a_threads_first_call_samples_what_any_other_does(
    cfg: RunConfig, engine: VllmEngine, model: Transformer
) -> None:
    """A worker computes in threads of its own, each turn maybe in a new one: vLLM's CPU attention
    plans a step for the calling thread's OpenMP count, which torch sets only at its first op there."""
    engine.load_state(hf_state_dict(model))
    prompt = make_tokenizer(cfg).encode_prompt("37")
    here = engine.generate_many([(prompt, [5, 6])], max_new_tokens=4)
    with ThreadPoolExecutor(1) as fresh:
        there = fresh.submit(engine.generate_many, [(prompt, [5, 6])], None, 4).result(timeout=120)
    assert there == here
