"""The calculator environment: the model may call a calculator before it answers an arithmetic question.

A call is written `<calc>12*(3+4)</calc>`; the environment answers `<result>84</result>` (or
`<result>error: division by zero</result>`), one line a call, at most `MAX_CALLS` calls a turn. A
turn without a call is the answer and ends the episode. The score is the math answer check
(`tasks/answers.py`) of that answer against the prompt's reference: 1 or 0, in `parts["answer"]`; an
episode that ended at a bound while still calling scores 0.

Invariant: deterministic (the seed is not used), no Python evaluated (`calc.py`), every step bounded.
"""

from __future__ import annotations

import re

from cadence.tasks.answers import is_correct
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript
from cadence.tasks.environments.calc import calculate

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
MAX_CALLS = 4
INSTRUCTIONS = (
    "You may use a calculator: write <calc>expression</calc> (whole numbers, + - * / and parentheses)"
    " and its result comes back. When you know the answer, reply with it and no calculator call."
)


class Calculator(Environment):
    name = "calculator"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt
        self.seed = seed

    async def start(self) -> str:
        return f"{self.prompt.text}\n\n{INSTRUCTIONS}"

    async def step(self, response: str) -> Reply:
        calls = CALL.findall(response)
        if not calls:
            return Reply("", done=True)
        results = [calculate(expression) for expression in calls[:MAX_CALLS]]
        lines = [f"<result>{result}</result>" for result in results]
        if len(calls) > MAX_CALLS:
            lines.append(f"<result>error: at most {MAX_CALLS} calls a turn; the rest were not run</result>")
        errors = sum(result.startswith("error:") for result in results)
        return Reply("\n".join(lines), tool_calls=len(results), tool_errors=errors)

    async def score(self, transcript: Transcript) -> Score:
        answer = transcript.last_response
        correct = answer is not None and not CALL.search(answer) and is_correct(answer, self.prompt.answer)
        value = float(correct)
        return Score(reward=value, correct=value, parts={"answer": value})
