"""Tool calls in the Hermes form (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`): the tools'
description a system prompt carries, a tool call and a tool's result as text, and a completion's tool
calls parsed back into the OpenAI `tool_calls` form. One small module, so that a parser by tokenizer
family can take its place.

Invariant: `parse` never raises: a block that is not a JSON object with a string `name` is left in
the content as the model wrote it; `call_text(parse(text).calls)` is the calls as a template-less
conversation shows them again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's `function.arguments`


@dataclass(frozen=True)
class Parsed:
    content: str | None  # the text outside the calls (None when nothing is left)
    calls: list[ToolCall]


def parse(text: str) -> Parsed:
    """The tool calls of a completion's `text` and the content around them."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    last = 0
    for match in BLOCK.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return Parsed(content or None, calls)


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return ToolCall(value["name"], arguments)
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def call_text(calls: Sequence[ToolCall]) -> str:
    """The calls as the model writes them, one block each."""
    blocks = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        body = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(blocks)


def result_text(content: str) -> str:
    """A tool's result as the model reads it."""
    return f"<tool_response>\n{content}\n</tool_response>"


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools' description, for the system prompt (the Hermes and Qwen wording)."""
    described = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{described}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within"
        " <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
