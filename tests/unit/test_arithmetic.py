"""The arithmetic task: deterministic prompts, and a scorer that wants one integer, the sum."""

from __future__ import annotations

import pytest

from cadence.config import TaskConfig
from cadence.tasks.arithmetic import ArithmeticTask
from cadence.tasks.registry import make_task


def test_prompts_are_deterministic_and_their_answers_are_the_sums() -> None:
    task = make_task(TaskConfig(name="arithmetic", max_operand=9), seed=1)
    assert isinstance(task, ArithmeticTask)
    first, again = task.prompts(3, 5), task.prompts(3, 5)
    assert first == again and [p.prompt_id for p in first] == [15, 16, 17, 18, 19]
    for p in first:
        a, b = (int(x) for x in p.text.removeprefix("What is ").split("?")[0].split(" + "))
        assert int(p.answer) == a + b and 0 <= a <= 9 and 0 <= b <= 9


@pytest.mark.parametrize(
    ("response", "finished", "reward", "correct"),
    [
        ("42", True, 1.0, 1.0),
        (" 42\n", True, 1.0, 1.0),
        ("41", True, 0.2, 0.0),
        ("42", False, 0.0, 0.0),
        ("The answer is 42", True, 0.0, 0.0),
        ("4 2", True, 0.0, 0.0),
        ("", True, 0.0, 0.0),
    ],
)
def test_score(response: str, finished: bool, reward: float, correct: float) -> None:
    task = ArithmeticTask(TaskConfig(name="arithmetic", format_weight=0.2), seed=0)
    score = task.score("What is 20 + 22?", response, "42", finished)
    assert score.reward == pytest.approx(reward) and score.correct == correct
