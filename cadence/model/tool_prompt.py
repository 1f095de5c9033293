"""Tools in the model's own chat format: which family of call format a chat template teaches (read
off the template's text), and the system block that declares the tools to a model whose template has no
`tools` support of its own (Hermes-style, or Llama 3.1's words for a "llama3" template).

```
 template text holds <tool_call>                  ─► "hermes"  (Hermes, Qwen2.5, Qwen3)
 template text holds <|python_tag|> or ipython    ─► "llama3"  (Llama 3.1 and later)
 else (SmolLM2, ChatML, no template)              ─► "hermes", the tools declared by `tools_block`
```

Invariant: `with_tools` leaves a conversation as it is when there are no tools or the template
renders them itself (`apply_chat_template(..., tools=...)`); else the block is the system message's
end (a system message is added first when the conversation has none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

HERMES_BLOCK = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{schemas}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

LLAMA3_BLOCK = """Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}. Do not use variables.

{schemas}"""


def family_of(template_text: str) -> str:
    """The call format a chat template's text teaches: "llama3" or "hermes" (the default)."""
    if "<|python_tag|>" in template_text or "ipython" in template_text:
        return "llama3"
    return "hermes"


def renders_tools(template_text: str) -> bool:
    """Whether a chat template renders a `tools` list itself."""
    return "tools" in template_text


def tools_block(schemas: Sequence[Mapping[str, Any]], family: str = "hermes") -> str:
    """The system block that declares `schemas` and how `family` writes a call."""
    block = LLAMA3_BLOCK if family == "llama3" else HERMES_BLOCK
    return block.format(schemas="\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas))


def with_tools(
    messages: list[dict[str, str]], schemas: Sequence[Mapping[str, Any]], template_text: str
) -> list[dict[str, str]]:
    """`messages` with the tools declared in a system block, where the template does not do it."""
    if not schemas or renders_tools(template_text):
        return messages
    block = tools_block(schemas, family_of(template_text))
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
