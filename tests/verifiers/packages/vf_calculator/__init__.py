"""A verifiers 0.4.0 environment as an installed package would ship one (`taskset.id = "vf_calculator"`):
a taskset of arithmetic questions, a task whose rubric is three weighted `@vf.reward`s (the answer right,
the tool used, how much of the answer is digits), and a harness that plays a tool loop in-process (ask with a `calculate` tool, run each
call, ask again until the model answers without one) through the interception endpoint it is given.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Iterable
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes import ProgramResult

__all__ = ["CalculatorTaskset", "ToolLoop"]

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "The value of an arithmetic expression of whole numbers.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """The expression's value, or why it has none (+, - and * of whole numbers only)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return int(OPS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError(ast.dump(node))

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as exc:
        return f"error: {exc}"


class CalculatorData(vf.TaskData):
    answer: str = ""


class CalculatorTask(vf.Task[CalculatorData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.25)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(any(m.role == "tool" for m in trace.messages))

    @vf.reward(weight=0.5)
    async def numeric(self, trace: vf.Trace) -> float:
        return digit_share(trace.last_reply)


def digit_share(text: str) -> float:
    """How much of `text` is digits (0 when empty)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


class CalculatorTaskset(vf.Taskset[CalculatorTask, vf.TasksetConfig]):
    def load(self) -> Iterable[CalculatorTask]:
        for a, b in [(17, 23), (41, 58), (12, 12)]:
            yield CalculatorTask(CalculatorData(prompt=f"Calculate {a} * {b}.", answer=str(a * b)))


class ToolLoopConfig(vf.HarnessConfig):
    max_calls: int = 3


class ToolLoop(vf.Harness[ToolLoopConfig]):
    """The tool loop, in this process: every model call goes through `endpoint` with `secret`."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": data.prompt_text}]
        try:
            for _ in range(self.config.max_calls):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)
                message = reply.choices[0].message
                if not message.tool_calls:
                    break
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls:
                    assert call.type == "function", call
                    expression = json.loads(call.function.arguments).get("expression", "")
                    messages.append(
                        {"role": "tool", "tool_call_id": call.id, "content": calculate(expression)}
                    )
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")
