"""The calculator agent (`cadence.tasks.agents.calculator:agent`) through the real endpoint: the model's
call is run and its result read back, the answer scored by the math check, one sequence a sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.episodes import AgentEpisodes
from cadence.tasks.agents.calculator import agent, run_tool
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated
from tests.agent_rig import byte_checkpoint

pytestmark = pytest.mark.timeout(60)


class Turns:
    """A `Generate` that writes `answers[k]` (and its end of turn) at each row's k-th call."""

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


@pytest.mark.parametrize(("answer", "reward"), [("320", 1.0), ("321", 0.0)])
async def test_the_calculator_agent_runs_the_models_call_and_scores_its_answer(
    tmp_path: Path, answer: str, reward: float
) -> None:
    tokenizer = HFTokenizer(byte_checkpoint(tmp_path / "ckpt"))
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "20*16"}}\n</tool_call>'
    generate = Turns(tokenizer, [call, answer])
    episodes = AgentEpisodes("calculator", agent, tokenizer, Bounds(max_turns=3, max_turn_tokens=128))
    prompt = Prompt(0, "Calculate 20 * 16.", "320")
    (group,) = await episodes.run(
        generate, [(prompt, [5], tokenizer.encode_prompt(prompt.text))], tokenizer.eos_id
    )
    first, second = (tokenizer.decode(p, skip_special=False) for p in generate.prompts)
    example = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "41*58"}}\n</tool_call>'
    assert "Calculate 41 * 58." in first and example in first and "<tools>" in first
    assert second.endswith(
        "<|im_start|>user\n<tool_response>\n320\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert group.scores[0].reward == reward and group.episodes is not None
    assert (
        group.episodes.tool_calls == [1] and group.episodes.turns == [2] and group.episodes.sequences == [1]
    )


def test_a_call_without_an_expression_is_answered_with_an_error() -> None:
    assert run_tool('{"expression": "6*7"}') == "42"
    assert run_tool("[1]").startswith("error:") and run_tool("{}").startswith("error:")
