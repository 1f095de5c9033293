"""A completion served as OpenAI's stream (`stream: true`): the events a client reads, made from the
completion's whole body once it is made (`chunks`), and written as server-sent events (`send`).

```
 body ─► chunk 0: every choice's delta whole (role, content, tool_calls with their index), its
         logprobs and the extension's token_ids / token_logprobs; the body's prompt_token_ids, cadence
      ─► chunk 1: each choice's finish_reason, an empty delta
      ─► chunk 2 (stream_options.include_usage): no choices, the usage
      ─► data: [DONE]
```

Invariant: the deltas joined give exactly the body's message of each choice, so a streaming agent
reads what a non-streaming one would; the stream starts only once the completion is made (the
episode's tokens are sampled in the batch's engine calls, not a token at a time), so an error is
still one OpenAI error body, never a stream cut short.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web


def chunks(body: Mapping[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The stream's events of a completion's `body` (chat.py `response`)."""
    head = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
    }
    deltas, ends = [], []
    for choice in body["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(message["tool_calls"])]
        deltas.append(
            {
                "index": choice["index"],
                "delta": delta,
                "logprobs": choice["logprobs"],
                "finish_reason": None,
                "token_ids": choice["token_ids"],
                "token_logprobs": choice["token_logprobs"],
            }
        )
        ends.append(
            {
                "index": choice["index"],
                "delta": {},
                "logprobs": None,
                "finish_reason": choice["finish_reason"],
            }
        )
    events = [
        {**head, "choices": deltas, "prompt_token_ids": body["prompt_token_ids"], "cadence": body["cadence"]},
        {**head, "choices": ends},
    ]
    if include_usage:
        events.append({**head, "choices": [], "usage": body["usage"]})
    return events


async def send(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    """`events` as server-sent events, then `[DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
