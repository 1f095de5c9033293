"""The OpenAI chat-completions wire as the agent endpoint speaks it: a request decoded and checked
(`decode_request`), its messages as plain `Said` values and as the chat template's messages (calls,
results and tools in the model family's form, `toolcalls.py`), errors in OpenAI's body (`ApiError`),
and a response with its extension (`response`).

```
 tool_choice  "auto" (or unset): tools offered, calls read │ "none": tools not offered, no call read
              "required", {"type": "function", ...}: 400 (not enforceable without constrained decoding)
 logprobs     true: each choice's `logprobs.content` │ top_logprobs > 0: 400 (the engine gives none)
 stream       true: the completion made whole, then sent as OpenAI's stream of chunks (stream.py)
```

Invariant: a request that is not what this endpoint serves raises `ApiError` with the status, type,
code and parameter OpenAI would give, never anything else; fields the endpoint does not use are read
past (OpenAI clients send many).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from cadence.rollout.agent import toolcalls
from cadence.rollout.agent.toolcalls import ToolCall
from cadence.tasks.tools.calls import Family


class ApiError(Exception):
    """What the endpoint answers instead of a completion: `status` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Part(msgspec.Struct):
    type: str
    text: str | None = None


class _Function(msgspec.Struct):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct):
    function: _Function
    id: str = ""
    type: str = "function"


class _Message(msgspec.Struct):
    role: str
    content: str | list[_Part] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[_Message]
    tools: list[dict[str, Any]] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: Annotated[int, Meta(ge=1)] = 1
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None

    @property
    def usage_streamed(self) -> bool:
        """A stream ends with a chunk of the usage (`stream_options.include_usage`)."""
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def reads_calls(self) -> bool:
        """The model is offered the tools and its calls are read: `tool_choice` is not "none"."""
        return self.tool_choice != "none"

    @property
    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools the model is offered: none under `tool_choice` "none"."""
        return self.tools if self.reads_calls else None

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


_DECODER = msgspec.json.Decoder(ChatRequest)
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Said:
    """One message as the endpoint compares and renders it."""

    role: str
    content: str
    calls: tuple[ToolCall, ...] = ()


def decode_request(body: bytes) -> tuple[ChatRequest, list[Said]]:
    """The request and its messages; `ApiError` for what is not a request this endpoint serves."""
    try:
        request = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not request.messages:
        raise ApiError(400, "messages is empty", param="messages")
    _check_tool_choice(request.tool_choice)
    if request.top_logprobs:
        raise ApiError(
            400,
            f"top_logprobs = {request.top_logprobs}: the engine gives the sampled token's log-prob"
            " alone; leave top_logprobs unset or 0 (logprobs: true gives the sampled ones)",
            param="top_logprobs",
            code="unsupported_value",
        )
    return request, [_said(m, i) for i, m in enumerate(request.messages)]


def _check_tool_choice(choice: str | dict[str, Any] | None) -> None:
    if choice is None or choice in ("auto", "none"):
        return
    if choice == "required" or isinstance(choice, dict):
        raise ApiError(
            400,
            f"tool_choice = {choice!r} cannot be enforced (the model is sampled freely, without"
            " constrained decoding): use 'auto' or 'none'",
            param="tool_choice",
            code="unsupported_value",
        )
    raise ApiError(400, f"tool_choice = {choice!r} is not one of 'auto', 'none'", param="tool_choice")


def _said(message: _Message, index: int) -> Said:
    if message.role not in ROLES:
        raise ApiError(
            400, f"messages[{index}].role {message.role!r} is not one of {ROLES}", param="messages"
        )
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise ApiError(400, f"messages[{index}]: only text content parts are served", param="messages")
        content = "".join(part.text or "" for part in content)
    calls = tuple(ToolCall(c.function.name, c.function.arguments) for c in message.tool_calls or ())
    role = "system" if message.role == "developer" else message.role
    return Said(role, content or "", calls)


def canonical(said: Said) -> Said:
    """`said` with its calls' arguments in one JSON spelling, for comparing messages."""
    return Said(
        said.role, said.content.strip(), tuple(ToolCall(c.name, _json(c.arguments)) for c in said.calls)
    )


def _json(text: str) -> str:
    try:
        return msgspec.json.encode(msgspec.json.decode(text), order="sorted").decode()
    except msgspec.DecodeError:
        return text


def template_messages(
    said: Sequence[Said],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_role: str,
    family: Family = "hermes",
) -> list[dict[str, str]]:
    """`said` as the chat template's role and content messages: calls and results in `family`'s form
    (`toolcalls.py`), tool results in the role `tool_role`, the tools described in the system prompt."""
    out = []
    for message in said:
        if message.role == "tool":
            out.append({"role": tool_role, "content": toolcalls.result_text(message.content, family)})
        elif message.calls:
            calls = toolcalls.calls_text(message.calls, family)
            out.append({"role": message.role, "content": f"{message.content}\n{calls}".lstrip("\n")})
        else:
            out.append({"role": message.role, "content": message.content})
    if tools:
        described = toolcalls.tools_text(tools, family)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


@dataclass(frozen=True)
class Choice:
    """One sampled answer: its text (cut at a stop string), ids and log-probs, why it ended, the
    assistant message it is (`answer`), and its log-probs in OpenAI's form when asked."""

    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # stop, length ("tool_calls" in the response when it holds calls)
    said: Said
    openai_logprobs: list[dict[str, Any]] | None = None


def answer(text: str, family: Family | None) -> Said:
    """The assistant message a completion's `text` is: its tool calls read in `family`'s form (None:
    `tool_choice` "none", nothing is read)."""
    if family is None:
        return Said("assistant", text)
    read = toolcalls.read(text, family)
    return Said("assistant", read.content or "", tuple(read.calls))


def response(
    model: str, prompt: Sequence[int], choices: Sequence[Choice], call: str, extension: Mapping[str, Any]
) -> dict[str, Any]:
    """The completion's body: OpenAI's fields, and `prompt_token_ids`, each choice's `token_ids` and
    `token_logprobs`, and `cadence` (`extension`: the weights' version, what it was sampled at)."""
    rendered = []
    for i, choice in enumerate(choices):
        said = choice.said
        message: dict[str, Any] = {"role": "assistant", "content": said.content or None}
        reason = choice.finish_reason
        if said.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{call}_{i}_{j}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for j, c in enumerate(said.calls)
            ]
            reason = "tool_calls"
        logprobs = choice.openai_logprobs
        rendered.append(
            {
                "index": i,
                "message": message,
                "finish_reason": reason,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "token_ids": choice.tokens,
                "token_logprobs": choice.logprobs,
            }
        )
    completion = sum(len(c.tokens) for c in choices)
    return {
        "id": f"chatcmpl-{call}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": rendered,
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion,
            "total_tokens": len(prompt) + completion,
        },
        "prompt_token_ids": list(prompt),
        "cadence": dict(extension),
    }


def models(model: str) -> dict[str, Any]:
    """`/v1/models`: the one model served."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "cadence"}]}


def new_call_id() -> str:
    return uuid.uuid4().hex[:16]
