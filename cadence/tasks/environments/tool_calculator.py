"""The calculator as a JSON tool: the same safe calculator (`calc.py`) as the `<calc>` environment,
called the way the model's chat template writes tool calls (`<tool_call>{"name": "calculate", ...}`
for Hermes, Qwen and SmolLM2; a JSON object for Llama 3.1), built only from `cadence.tasks.tools`.

The opening: the instructions, one worked example in the model's own call format (a small instruct
model imitates an example in its conversation far more than it follows instructions), the question.
A turn without a call is the answer, scored by the math answer check against the prompt's reference.

Invariant: deterministic, no Python evaluated, every call bounded by construction (`calc.py`).
"""

from __future__ import annotations

from cadence.tasks.environments.calc import CalcError, evaluate, show
from cadence.tasks.tools.environment import Example, tool_environment
from cadence.tasks.tools.toolbox import ToolError

INSTRUCTIONS = (
    "You may call the calculate tool to do arithmetic. When you know the answer, reply with it and no"
    " tool call."
)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: whole numbers with + - * / and parentheses, such as 12*(3+4)
    """
    try:
        return show(evaluate(expression))
    except CalcError as exc:
        raise ToolError(str(exc)) from None


EXAMPLE = Example("Calculate 17 * 23.", (("calculate", {"expression": "17*23"}, "391"),), "391")

# the factory: environment.name = "tool_calculator"
ToolCalculator = tool_environment([calculate], INSTRUCTIONS, EXAMPLE, name="tool_calculator", max_calls=4)
