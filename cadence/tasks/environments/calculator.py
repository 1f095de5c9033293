"""The calculator environment: the model may call a calculator before it answers an arithmetic question.

The episode opens with the instructions as the system prompt and one worked example (a question, the
call, its result, the answer) before the question: a small instruct model hardly ever writes a call
from instructions alone, and imitates an example in its own conversation (docs/benchmarks.md). A call
is written `<calc>12*(3+4)</calc>`; the environment answers `<result>84</result>` (or
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
from cadence.tasks.environments.base import ChatMessage, Environment, Reply, Transcript
from cadence.tasks.environments.calc import calculate

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
MAX_CALLS = 4
INSTRUCTIONS = (
    "You may use a calculator: write <calc>expression</calc> (whole numbers, + - * / and parentheses)"
    " and its result comes back. When you know the answer, reply with it and no calculator call."
)

# the worked example before the question, the result in the environment's words
EXAMPLE = (
    ChatMessage("user", "Calculate 17 * 23."),
    ChatMessage("assistant", "<calc>17*23</calc>"),
    ChatMessage("user", "<result>391</result>"),
    ChatMessage("assistant", "391"),
)


class Calculator(Environment):
    name = "calculator"
    instructions = INSTRUCTIONS
    example: tuple[ChatMessage, ...] = EXAMPLE  # a subclass may give its own, or () for none

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt
        self.seed = seed

    async def start(self) -> list[ChatMessage]:
        return [
            ChatMessage("system", self.instructions),
            *self.example,
            ChatMessage("user", self.prompt.text),
        ]

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
