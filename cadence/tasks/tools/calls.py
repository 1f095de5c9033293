"""Tool calls as models write them, by the chat template's family, read out of a model turn's text.

```
 hermes (Hermes, Qwen2.5, Qwen3, SmolLM2):  <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>
                                            ... one block a call, several a turn, text around them
 llama3 (Llama 3.1 and later):              {"name": "add", "parameters": {"a": 1}}
                                            ... the turn is the call (after <|python_tag|> if written);
                                            several: objects one after another, or a JSON list
```

A turn with no call in it is an answer (`Parsed.calls` empty). Both families take `arguments` or
`parameters`, and arguments written as a JSON string holding an object. `Parsed.content` is the
turn's text outside the calls that were read (a malformed call stays in it as written): what an
OpenAI-form answer shows as the message's content beside its `tool_calls`.

Invariant: `parse` never raises; every call the model began is in `Parsed.calls` in the order written,
read (`ToolCall`) or not (`BadCall`, saying why in words the model can act on), so a malformed call
is answered like any other, never dropped and never the end of the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["hermes", "llama3"]
FAMILIES: tuple[Family, ...] = ("hermes", "llama3")
MAX_CALL_CHARS = 8000  # a call's JSON longer than this is refused unread

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class BadCall:
    why: str  # what the model reads: what is wrong and how a call is written


@dataclass(frozen=True)
class Parsed:
    calls: list[ToolCall | BadCall]
    content: str = ""  # the text outside the calls read (`ToolCall`s), as written

    @property
    def bad(self) -> int:
        return sum(isinstance(call, BadCall) for call in self.calls)


def parse(text: str, family: Family) -> Parsed:
    """The calls in a model turn's `text`, as `family` writes them."""
    return _parse_llama3(text) if family == "llama3" else _parse_hermes(text)


def write_call(name: str, arguments: object, family: Family) -> str:
    """A call as `family` writes it (a worked example in the model's own format, a call of the
    conversation written again); `arguments` a JSON object's value (any JSON value is written)."""
    if family == "llama3":
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def how_to_call(family: Family) -> str:
    """One line saying how a call is written, for the messages that answer a malformed one."""
    return f"write a call as {write_call('name', {'argument': 'value'}, family)!s}".replace("\n", "")


def _parse_hermes(text: str) -> Parsed:
    calls: list[ToolCall | BadCall] = []
    kept, last = [], 0
    for block in _HERMES.finditer(text):
        call = _read(block.group(1).strip(), "hermes")
        calls.append(call)
        if isinstance(call, ToolCall):
            kept.append(text[last : block.start()])
            last = block.end()
    kept.append(text[last:])
    if "<tool_call>" in _HERMES.sub("", text):
        calls.append(BadCall(f"a <tool_call> without its </tool_call>: {how_to_call('hermes')}"))
    return Parsed(calls, "".join(kept))


def _parse_llama3(text: str) -> Parsed:
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    elif not body.startswith(("{", "[")):
        return Parsed([], text)  # an answer
    if len(body) > MAX_CALL_CHARS:
        return Parsed([BadCall(f"the call is {len(body)} characters, more than {MAX_CALL_CHARS}")], text)
    calls: list[ToolCall | BadCall] = []
    decoder = json.JSONDecoder()
    at, read = 0, 0  # body[:read]: the calls read
    while at < len(body):
        try:
            value, end = decoder.raw_decode(body, at)
        except json.JSONDecodeError as exc:
            calls.append(BadCall(f"the call is not valid JSON ({exc.msg} at character {exc.pos})"))
            break
        items = [_call(item, "llama3") for item in (value if isinstance(value, list) else [value])]
        calls += items
        if all(isinstance(item, ToolCall) for item in items) and read == at:
            read = end
        at = end
        while at < len(body) and body[at] in " \t\r\n;,":
            at += 1
        read = at if read == end else read
    return Parsed(calls, body[read:] if read else text)


def _read(body: str, family: Family) -> ToolCall | BadCall:
    if len(body) > MAX_CALL_CHARS:
        return BadCall(f"the call is {len(body)} characters, more than {MAX_CALL_CHARS}")
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return BadCall(
            f"the call is not valid JSON ({exc.msg} at character {exc.pos}): {how_to_call(family)}"
        )
    return _call(value, family)


def _call(value: object, family: Family) -> ToolCall | BadCall:
    """A decoded call's name and arguments, or why it is not one."""
    if not isinstance(value, dict):
        return BadCall(f"the call is a JSON {type(value).__name__}, not an object: {how_to_call(family)}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return BadCall(f'the call has no "name" string: {how_to_call(family)}')
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return BadCall(f"the arguments of {name!r} are a string that is not JSON ({exc.msg})")
    if not isinstance(arguments, dict):
        return BadCall(f"the arguments of {name!r} are not a JSON object")
    return ToolCall(name, arguments)
