"""The calculator as an agent of the OpenAI client (`environment.agent =
"cadence.tasks.agents.calculator:agent"`): it asks the question with a `calculate` tool, runs every
call the model makes (`tasks/environments/calc.py`, exact, no Python evaluated) and asks again, until
the model answers without a call; the answer is scored by the math check. Two worked examples (a
call, its result, the answer) come before the question, as the calculator environment's one does.

Invariant: at most `MAX_CALLS` calls to the endpoint (keep `environment.max_turns` at least that), so
a model that keeps calling ends with reward 0, not an error.
"""

from __future__ import annotations

import json
from typing import Any

from cadence.tasks.answers import is_correct
from cadence.tasks.environments.calc import calculate

MAX_CALLS = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "The exact value of an expression of whole numbers, + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def worked(a: int, b: int) -> list[dict[str, Any]]:
    """One worked example: the question, the call, its result, the answer."""
    call = {"name": "calculate", "arguments": json.dumps({"expression": f"{a}*{b}"})}
    return [
        {"role": "user", "content": f"Calculate {a} * {b}."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"call_{a}", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": f"call_{a}", "content": str(a * b)},
        {"role": "assistant", "content": str(a * b)},
    ]


# two worked examples: with one, SmolLM2-135M writes no call in 16 samples; with two, in 10 of 16
EXAMPLE = worked(17, 23) + worked(41, 58)


def run_tool(arguments: str) -> str:
    """One call's result, or why it has none."""
    try:
        expression = json.loads(arguments).get("expression", "")
    except (ValueError, AttributeError):
        return "error: the arguments are not a JSON object with an expression"
    return calculate(str(expression))


async def agent(client: Any, task: Any) -> float:
    messages: list[Any] = [
        {"role": "system", "content": "Use the calculate tool for arithmetic, then reply with the answer."},
        *EXAMPLE,
        {"role": "user", "content": task.prompt},
    ]
    for _ in range(MAX_CALLS):
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return float(is_correct(message.content or "", task.answer))
        messages.append(message)
        for call in message.tool_calls:
            result = run_tool(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
