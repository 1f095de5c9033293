"""A tool environment made of Python functions and a task: the model calls the tools in its own
format until it answers without a call, and the answer is scored.

```
 start ─► [system: instructions] [a worked example, its calls written in the model's own format,
          their results as tool messages] user: the prompt        (tools(): the schemas, rendered
                                                                   by the chat template)
 step(turn) ─► parse(turn, setting.tool_format)
   no call  ─► Reply(done): the turn is the answer
   calls    ─► Toolbox.answer within 0.9 of the step timeout ─► Reply(tool_results, tool_calls, tool_errors)
 score ─► check(answer, prompt) (default: the math answer check against the prompt's reference);
          an episode that ended while still calling scores 0
```

Invariant: a malformed call, an unknown tool, wrong arguments, a tool that raises or hangs are each
answered with an error message the model reads and counted in `tool_errors`; none ends the episode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.tasks.answers import is_correct
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import (
    ChatMessage,
    Environment,
    EnvironmentFactory,
    Reply,
    Transcript,
)
from cadence.tasks.tools.calls import Family, parse, write_call
from cadence.tasks.tools.toolbox import Toolbox

# the share of the step timeout a turn's calls may take, so the step answers before it is cut
TOOL_TIME_SHARE = 0.9

Check = Callable[[str, Prompt], float]


@dataclass(frozen=True)
class Example:
    """A worked example the opening shows in the model's own call format: a question, the calls
    (tool name, arguments, the result it gives), and the answer."""

    question: str
    calls: tuple[tuple[str, dict[str, Any], str], ...]
    answer: str

    def messages(self, family: Family) -> list[ChatMessage]:
        written = "\n".join(write_call(name, arguments, family) for name, arguments, _ in self.calls)
        results = [ChatMessage("tool", result) for _, _, result in self.calls]
        return [
            ChatMessage("user", self.question),
            ChatMessage("assistant", written),
            *results,
            ChatMessage("assistant", self.answer),
        ]


def math_answer(answer: str, prompt: Prompt) -> float:
    """1.0 when the answer's final value matches the prompt's reference (`tasks/answers.py`), else 0.0."""
    return float(is_correct(answer, prompt.answer))


class ToolEnvironment(Environment):
    name = "tools"

    def __init__(
        self,
        prompt: Prompt,
        toolbox: Toolbox,
        instructions: str = "",
        example: Example | None = None,
        check: Check = math_answer,
    ) -> None:
        self.prompt = prompt
        self.toolbox = toolbox
        self.instructions = instructions
        self.example = example
        self.check = check
        self.answer: str | None = None

    def tools(self) -> Sequence[Mapping[str, Any]]:
        return self.toolbox.schemas()

    @property
    def family(self) -> Family:
        return "llama3" if self.setting.tool_format == "llama3" else "hermes"

    async def start(self) -> list[ChatMessage]:
        system = [ChatMessage("system", self.instructions)] if self.instructions else []
        example = self.example.messages(self.family) if self.example is not None else []
        return [*system, *example, ChatMessage("user", self.prompt.text)]

    async def step(self, response: str) -> Reply:
        parsed = parse(response, self.family)
        if not parsed.calls:
            self.answer = response
            return Reply(done=True)
        answers = await self.toolbox.answer(parsed, TOOL_TIME_SHARE * self.setting.step_timeout_s)
        return Reply(
            tool_results=tuple(a.text for a in answers),
            tool_calls=len(answers),
            tool_errors=sum(a.error for a in answers),
        )

    async def score(self, transcript: Transcript) -> Score:
        value = float(self.check(self.answer, self.prompt)) if self.answer is not None else 0.0
        return Score(reward=value, correct=value, parts={"answer": value})


def tool_environment(
    tools: Sequence[Callable[..., Any]],
    instructions: str = "",
    example: Example | None = None,
    check: Check = math_answer,
    name: str = "tools",
    max_calls: int = 8,
    max_result_chars: int = 4000,
) -> EnvironmentFactory:
    """The factory of a tool environment over `tools` (typed, documented functions, sync or async):
    `environment.name = "my_module:make"` with `make = tool_environment([...])` in `my_module`."""
    toolbox = Toolbox(tools, max_calls=max_calls, max_result_chars=max_result_chars)

    def make(prompt: Prompt, seed: int) -> Environment:
        env = ToolEnvironment(prompt, toolbox, instructions, example, check)
        env.name = name
        return env

    return make
