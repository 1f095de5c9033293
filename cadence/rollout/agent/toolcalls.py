"""Tool calls between OpenAI's form and the model's own, for the endpoint: a completion's calls read by
the tools package's parser of the model's family (`cadence.tasks.tools.calls`) into OpenAI's
`tool_calls` and the content around them, and a conversation's calls, results and tools written as
that family reads them. The family is the chat template's (`cadence.model.tool_prompt.family_of`), as
the tool environments choose it.

```
 hermes (Hermes, Qwen, SmolLM2, no template): calls <tool_call>{"name", "arguments"}</tool_call>,
          results <tool_response>...</tool_response>, tools in the Hermes system block
 llama3 (Llama 3.1 and later):                calls {"name", "parameters"} one a line,
          results as written, tools in Llama 3.1's words
```

Invariant: `read` never raises; a call the parser could not read (`BadCall`) stays in the content as
the model wrote it, since OpenAI's form has no place for a malformed call; the calls of
`read(calls_text(calls))` are `calls` again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.model.tool_prompt import tools_block
from cadence.tasks.tools.calls import Family, parse, write_call
from cadence.tasks.tools.calls import ToolCall as Read


@dataclass(frozen=True)
class ToolCall:
    """A call in OpenAI's form."""

    name: str
    arguments: str  # a JSON object's text, as OpenAI's `function.arguments`


@dataclass(frozen=True)
class Answer:
    content: str | None  # the text outside the calls (None when nothing is left)
    calls: list[ToolCall]


def read(text: str, family: Family) -> Answer:
    """The tool calls of a completion's `text`, as `family` writes them, and the content around them."""
    parsed = parse(text, family)
    calls = [
        ToolCall(call.name, json.dumps(call.arguments, ensure_ascii=False))
        for call in parsed.calls
        if isinstance(call, Read)
    ]
    content = parsed.content.strip() if calls else text
    return Answer(content or None, calls)


def calls_text(calls: Sequence[ToolCall], family: Family) -> str:
    """The calls as the model writes them, one a line (arguments that are not JSON written as a string)."""
    written = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        written.append(write_call(call.name, arguments, family))
    return "\n".join(written)


def result_text(content: str, family: Family) -> str:
    """A tool's result as the model reads it."""
    return content if family == "llama3" else f"<tool_response>\n{content}\n</tool_response>"


def tools_text(tools: Sequence[Mapping[str, Any]], family: Family) -> str:
    """The tools' description, for the system prompt."""
    return tools_block(tools, family)
