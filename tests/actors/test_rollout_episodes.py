"""A rollout worker with an environment (`environment.name`), a real publisher and a tiny real model; the
test plays dispatcher and trainer. Each sample is an episode: the group's prompt is the first message,
each completion the episode's ids after it, with a mask (0: the environment's) and log-probs that a
forward over the final ids gives at every sampled token, and 0.0 at the environment's."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import torch

from cadence.actors.rollout import RolloutWorker
from cadence.config import RunConfig
from cadence.launch.build import make_engine, make_learner, make_tokenizer, vocab_limit
from cadence.launch.settings import group_bounds
from cadence.model.engine import sample_seed
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.turns import ChatTurns
from cadence.monitor.samples import sample_record
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript, opening_text
from cadence.tasks.environments.calculator import Calculator
from cadence.transport.inproc import InprocNetwork, InprocServer
from cadence.wire.meaning import eval_result_problem, group_problem
from cadence.wire.messages import (
    Assignment,
    EvalResult,
    GroupResult,
    WorkRequest,
    decode_frames,
    encode_frames,
)
from tests.conftest import episodes_of, expect, tiny_config
from tests.worker_rig import welcomed_worker

pytestmark = pytest.mark.timeout(60)

EPISODES = (
    "model.max_position=384",
    "environment.max_tokens=96",
    "environment.max_turn_tokens=12",
    "environment.max_turns=3",
    "monitor.samples_fraction=1.0",
    "transport.liveness=200",
)


class Again(Environment):
    """Asks for the answer again after every turn, until the runner's max_turns; one tool call a turn."""

    name = "again"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt

    async def start(self) -> str:
        return f"Say {self.prompt.text}."

    async def step(self, response: str) -> Reply:
        return Reply("Once more.", tool_calls=1, tool_errors=len(response) % 2)

    async def score(self, transcript: Transcript) -> Score:
        right = float((transcript.last_response or "").strip() == self.prompt.answer)
        return Score(reward=right, correct=right, parts={"answer": right})


@dataclass
class Rig:
    cfg: RunConfig
    worker: RolloutWorker
    engine: TorchRolloutEngine
    dispatcher: InprocServer
    trainer: InprocServer
    peers: dict[str, bytes]


@pytest.fixture
async def rig(request: pytest.FixtureRequest, network: InprocNetwork) -> AsyncIterator[Rig]:
    cfg = tiny_config(*EPISODES, f"environment.name={request.param!r}")
    tokenizer = make_tokenizer(cfg)
    engine = make_engine(cfg, tokenizer)
    assert isinstance(engine, TorchRolloutEngine)
    weights = make_learner(cfg, tokenizer).weights()
    async with welcomed_worker(cfg, network, engine, weights, chunk_bytes=1 << 16) as w:
        yield Rig(cfg, w.worker, engine, w.dispatcher, w.trainer, w.peers)


def wire(msg: GroupResult) -> GroupResult:
    """`msg` as the trainer receives it."""
    got = decode_frames(encode_frames(msg, "w0", "test")).message
    assert isinstance(got, GroupResult)
    return got


def check_lined_up(result: GroupResult, cfg: RunConfig, vocab: int, samples: int) -> None:
    """Masks, tokens and log-probs line up; the meaning checks pass, within the run's sizes (of groups
    of `samples`, the assignment's)."""
    bounds = dataclasses.replace(group_bounds(cfg, vocab), samples=samples)
    assert group_problem(wire(result), bounds) is None
    assert len(result.masks) == len(result.completions) == len(result.logprobs)
    for tokens, mask, logprobs in zip(result.completions, result.masks, result.logprobs, strict=True):
        assert len(tokens) == len(mask) == len(logprobs) and set(mask) <= {0, 1}
        assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if m == 0)
        assert all(lp < 0.0 for m, lp in zip(mask, logprobs, strict=True) if m == 1)


@pytest.mark.parametrize("rig", ["calculator"], indirect=True)
async def test_a_calculator_worker_answers_an_assignment_with_episodes(rig: Rig) -> None:
    tokenizer = rig.worker.maker.tokenizer
    await rig.dispatcher.send(rig.peers["rollout"], Assignment(0, 0, 7, "What is 3+4?", "7", 4))
    result = await expect(rig.trainer, GroupResult, timeout=30)
    check_lined_up(result, rig.cfg, vocab_limit(rig.cfg, tokenizer), 4)
    opening = await Calculator(Prompt(7, "What is 3+4?", "7"), 0).start()
    assert result.prompt_tokens == ChatTurns(tokenizer).encode_prompt(opening)
    assert (
        len(episodes_of(result).turns) == len(episodes_of(result).env_s) == 4
        and "error" not in episodes_of(result).endings
    )
    assert all(r in (0.0, 1.0) for r in result.rewards) and set(result.reward_parts) == {"answer"}
    # each episode's first turn is today's single-turn sample of the same seed
    for i, tokens in enumerate(result.completions):
        seed = sample_seed(rig.cfg.seed, 0, 7, i)
        (alone,) = rig.engine.generate_many([(result.prompt_tokens, [seed])], max_new_tokens=12)[0]
        assert tokens[: len(alone.tokens)] == alone.tokens
        assert result.masks[i][: len(alone.tokens)] == [1] * len(alone.tokens)
    assert result.responses == [
        [text for j, text in enumerate(t) if j % 2][-1] for t in episodes_of(result).transcripts
    ]
    assert episodes_of(result).transcripts[0][0] == opening_text(opening)
    assert (await expect(rig.dispatcher, WorkRequest)).credits == 1


@pytest.mark.parametrize("rig", ["tests.actors.test_rollout_episodes:Again"], indirect=True)
async def test_every_turn_is_the_engines_and_every_message_the_environments(rig: Rig) -> None:
    tokenizer = rig.worker.maker.tokenizer
    await rig.dispatcher.send(rig.peers["rollout"], Assignment(0, 0, 5, "42", "4", 3))
    result = await expect(rig.trainer, GroupResult, timeout=30)
    check_lined_up(result, rig.cfg, vocab_limit(rig.cfg, tokenizer), 3)
    assert (
        episodes_of(result).turns == [3, 3, 3]
        and episodes_of(result).endings == ["max_turns"] * 3
        and episodes_of(result).tool_calls == [3] * 3
    )
    message = tokenizer.encode("Once more.")
    model = rig.engine.engine.model
    for tokens, mask, logprobs in zip(result.completions, result.masks, result.logprobs, strict=True):
        assert mask.count(0) == 2 * len(message)  # two answered turns appended, the third ended it
        assert [t for t, m in zip(tokens, mask, strict=True) if m == 0] == message * 2
        ids = result.prompt_tokens + tokens
        with torch.no_grad():
            forward = torch.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
        n = len(result.prompt_tokens)
        for j, (token, m) in enumerate(zip(tokens, mask, strict=True)):
            if m:
                assert logprobs[j] == pytest.approx(float(forward[n + j - 1, token]), abs=2e-4)
    record = sample_record(result)
    authors = [m["author"] for m in record["responses"][0]["messages"]]
    assert authors == ["environment", "model"] * 3 and record["responses"][0]["ended"] == "max_turns"
    await expect(rig.dispatcher, WorkRequest)
    # an eval assignment plays whole episodes at the eval settings (greedy) and answers the dispatcher
    await rig.dispatcher.send(rig.peers["rollout"], Assignment(0, 0, -1, "17", "7", 1, eval=True))
    answer = await expect(rig.dispatcher, EvalResult, timeout=30)
    assert eval_result_problem(answer, 1) is None and len(episodes_of(answer).transcripts[0]) == 6
    # with the episode's figures, as the group's: three model turns, each but the last answered
    assert (episodes_of(answer).turns, episodes_of(answer).endings, episodes_of(answer).tool_calls) == (
        [3],
        ["max_turns"],
        [3],
    )
    assert episodes_of(answer).env_tokens == [2 * len(message)] and len(episodes_of(answer).env_s) == 1
    assert rig.worker.groups_sent == 1 and rig.worker.weights.playing is None


@pytest.mark.parametrize("rig", ["calculator"], indirect=True)
async def test_no_version_is_loaded_while_episodes_run(rig: Rig) -> None:
    worker = rig.worker
    await rig.dispatcher.send(rig.peers["rollout"], Assignment(0, 0, 7, "1+1", "2", 2))
    await expect(rig.trainer, GroupResult, timeout=30)
    assert worker.weights.loaded == 0
    with (
        pytest.raises(RuntimeError, match="episodes of version 1 would go on with 0 loaded"),
        worker.weights.turn(1),
    ):
        pass
    worker.weights.playing = 0
    with pytest.raises(RuntimeError, match="version 1 asked while the episodes of 0 run"):
        await worker.weights.fetch_and_load(None, 1)  # type: ignore[arg-type]
    worker.weights.playing = None
