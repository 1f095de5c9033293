"""A verifiers environment through the worker's endpoint (`VerifiersAgent`): its harness's calls are
answered by the engine, its rubric (the task's weighted rewards) is the sample's reward, and an episode
verifiers counts as failed is scored `on_error`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.episodes import AgentEpisodes
from cadence.rollout.play import EngineGenerate
from cadence.rollout.results import GroupSamples
from cadence.tasks.agents.verifiers_env import VerifiersAgent
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated
from tests.agent_rig import byte_checkpoint, recording_engine
from tests.verifiers.helpers import VF_MARKS, installed

pytestmark = [*VF_MARKS, pytest.mark.timeout(120)]

CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "17*23"}}\n</tool_call>'
PROMPT = Prompt(0, "Calculate 17 * 23.", "391")


class Scripted:
    """A `Generate` that writes `answers[k]` (and its end of turn) at its k-th row."""

    def __init__(self, tokenizer: HFTokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers, self.max_context = tokenizer, answers, 8192
        self.prompts: list[list[int]] = []

    async def __call__(self, prompts: Any, seeds: Any, max_new_tokens: Any) -> list[Generated]:
        out = []
        for prompt in prompts:
            ids = self.tokenizer.encode(self.answers[len(self.prompts)]) + [self.tokenizer.eos_id]
            self.prompts.append(list(prompt))
            out.append(Generated(ids, [-0.25] * len(ids), True))
        return out


async def play(generate: Any, tokenizer: HFTokenizer, seeds: list[int], bounds: Bounds) -> GroupSamples:
    installed()
    agent = VerifiersAgent({"taskset": {"id": "vf_calculator"}}, correct="correct")
    episodes = AgentEpisodes("vf_calculator", agent, tokenizer, bounds)
    (group,) = await episodes.run(
        generate, [(PROMPT, seeds, tokenizer.encode_prompt(PROMPT.text))], tokenizer.eos_id
    )
    return group


@pytest.mark.parametrize(
    ("answer", "reward", "correct"), [("391", 1.75, 1.0), ("390", 0.75, 0.0), ("39x", 0.25 + 1 / 3, 0.0)]
)
async def test_the_rubric_scores_the_tool_loop_the_endpoint_answered(
    tmp_path: Path, answer: str, reward: float, correct: float
) -> None:
    tokenizer = HFTokenizer(byte_checkpoint(tmp_path / "ckpt"))
    generate = Scripted(tokenizer, [CALL, answer])
    group = await play(generate, tokenizer, [5], Bounds(max_turns=3, max_turn_tokens=128))
    first, second = (tokenizer.decode(p, skip_special=False) for p in generate.prompts)
    assert '"name": "calculate"' in first and first.endswith(
        "Calculate 17 * 23.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert second == first + (  # the harness's tool result, after the model's call, in one sequence
        f"{CALL}<|im_end|>\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    (score,) = group.scores
    digits = sum(c.isdigit() for c in answer) / len(answer)
    assert score.reward == pytest.approx(reward) and score.correct == correct
    assert score.parts == {"correct": correct, "used_tool": 0.25, "numeric": 0.5 * digits}
    assert group.episodes is not None and group.episodes.endings == ["done"]
    assert (
        group.episodes.turns == [2] and group.episodes.tool_calls == [1] and group.episodes.sequences == [1]
    )
    assert tokenizer.decode(group.completions[0], skip_special=False).endswith(f"{answer}<|im_end|>")


async def test_the_tiny_models_answers_are_the_samples_and_the_rubric_reads_them(tmp_path: Path) -> None:
    checkpoint = byte_checkpoint(tmp_path / "ckpt", max_position=1024)  # the tools' block: 660 tokens
    tokenizer, engine, seeds = HFTokenizer(checkpoint), recording_engine(checkpoint), [11, 12, 13]
    group = await play(EngineGenerate(engine), tokenizer, seeds, Bounds(max_turns=3, max_turn_tokens=16))
    assert group.prompt == engine.asked[seeds[0]].prompt
    for i, seed in enumerate(seeds):  # no call in the random model's answers: one call an episode
        sampled = engine.asked[seed].completion
        assert group.completions[i] == sampled.tokens and group.masks[i] == [1] * len(sampled.tokens)
        reply = (tokenizer.decode_response(sampled.tokens) or "").strip()
        digits = sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0
        parts = {"correct": float(reply == PROMPT.answer), "used_tool": 0.0, "numeric": 0.5 * digits}
        assert group.scores[i].parts == pytest.approx(parts)
    assert group.episodes is not None and group.episodes.turns == [1, 1, 1]
    assert group.episodes.endings == ["done"] * 3


async def test_an_episode_verifiers_counts_failed_is_scored_on_error(tmp_path: Path) -> None:
    tokenizer = HFTokenizer(byte_checkpoint(tmp_path / "ckpt"))
    generate = Scripted(tokenizer, [CALL, "391"])  # the second call is past max_turns: refused, 400
    group = await play(generate, tokenizer, [5], Bounds(max_turns=1, max_turn_tokens=128, on_error=-1.0))
    assert len(generate.prompts) == 1 and group.scores[0].reward == -1.0
    assert group.episodes is not None and group.episodes.endings == ["max_turns"]
