"""An agent that rewrites its history and branches, on a tiny real model through the real `openai`
client: each of its episode's sequences is a row of the one sample, every sampled token reaches the
loss exactly once (mask 1, the engine's log-prob, the learner's the same at its position), the group
is meaningful on the wire, and every row carries its episode's advantage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from cadence.model.checkpoint import load_checkpoint
from cadence.model.hf_tokenizer import HFTokenizer
from cadence.ops.advantages import group_advantages
from cadence.rollout.agent.episodes import AgentTask
from cadence.rollout.play import EngineGenerate
from cadence.rollout.results import group_result
from cadence.training.learner import TorchLearner
from cadence.training.train_group import TrainGroup, sampled_tokens
from cadence.wire.meaning import GroupBounds, group_problem
from cadence.wire.messages import Assignment, GroupResult, decode_frames, encode_frames
from tests.actors.test_agent_endpoint import ask, play
from tests.agent_rig import byte_checkpoint, recording_engine

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return byte_checkpoint(tmp_path_factory.mktemp("sequences") / "ckpt")


async def test_every_sequence_of_a_rewriting_agent_reaches_the_loss_once(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    engine = recording_engine(checkpoint)
    calls: dict[int, list[dict[str, Any]]] = {}

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        said = calls.setdefault(task.seed, [])

        async def call(messages: list[Any]) -> Any:
            reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=5)
            said.append(reply.model_dump())
            return reply.choices[0].message

        first = await call(ask(task))
        await call([*ask(task), first, {"role": "user", "content": "Sure?"}])  # goes on
        await call([{"role": "user", "content": "Someone said four. Right?"}])  # history rewritten
        await call([*ask(task), first, {"role": "user", "content": "Why?"}])  # a branch from the first
        return 1.0 if task.seed == 1 else 0.0

    group = await play(agent, EngineGenerate(engine), tokenizer, seeds=[1, 2])
    assert group.episodes is not None and group.episodes.sequences == [3, 3]
    assert group.episode_of == [0, 0, 0, 1, 1, 1]
    model, config = load_checkpoint(checkpoint)
    for episode, seed in enumerate((1, 2)):
        a, b, c, d = calls[seed]
        # the rows: a then b; c on its own; d after a, whose tokens the first row trains
        expected = [(b, [a, b]), (c, [c]), (d, [d])]
        for row, (last, trained) in enumerate(expected):
            i = 3 * episode + row
            tokens, mask, logprobs = group.completions[i], group.masks[i], group.logprobs[i]
            assert group.prompt + tokens == last["prompt_token_ids"] + last["choices"][0]["token_ids"]
            picked = [t for t, m in zip(tokens, mask, strict=True) if m]
            assert picked == [t for body in trained for t in body["choices"][0]["token_ids"]]
            assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == [
                lp for body in trained for lp in body["choices"][0]["token_logprobs"]
            ]
            assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
            ids = group.prompt + tokens  # the learner's log-prob at each trained position: the engine's
            with torch.no_grad():
                forward = torch.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
            for j, (token, m) in enumerate(zip(tokens, mask, strict=True)):
                if m:
                    at = len(group.prompt) + j - 1
                    assert logprobs[j] == pytest.approx(float(forward[at, token]), abs=2e-4)
    assert [sum(m for i in range(3 * e, 3 * e + 3) for m in group.masks[i]) for e in (0, 1)] == (
        group.episodes.call_tokens
    )

    sent = group_result(Assignment(0, 0, 3, "q", "4", 2), group, True, 0.1, 0.0, 1.0, 0)
    got = decode_frames(encode_frames(sent, "w0", "test")).message
    assert isinstance(got, GroupResult) and got.episode_of == group.episode_of
    vocab = tokenizer.vocab_size
    assert group_problem(got, GroupBounds(vocab, samples=2, rows=4 * 4)) is None
    assert group_problem(got, GroupBounds(vocab, samples=2, rows=2)) is not None  # a bound that is held

    train = TrainGroup.of(got, sampler_logprobs=False)
    own = group_advantages(torch.tensor(got.rewards), scale=True).tolist()
    assert train.advantage_list(True) == [own[0]] * 3 + [own[1]] * 3
    assert sampled_tokens([train]) == group.episodes.call_tokens
    learner = TorchLearner(model, config, tokenizer, 1e-3, 0.0, 0.2, 0.28, 0.0, 1.0)
    stats = learner.train_groups([train])
    assert stats["entropy_tokens"] == sum(map(sum, got.masks))  # every trained token reached the loss
