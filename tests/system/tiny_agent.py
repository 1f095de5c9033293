"""A tiny agent written against the `openai` client, as a user's would be (`environment.agent =
"tests.system.tiny_agent:agent"`): it asks, reads the answer, asks again, and is rewarded by the length
of its last answer's text (so a group's samples differ and train)."""

from __future__ import annotations

from typing import Any


async def agent(client: Any, task: Any) -> float:
    messages: list[Any] = [{"role": "user", "content": task.prompt}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
    messages += [reply.choices[0].message, {"role": "user", "content": "Again."}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
    return float(len(reply.choices[0].message.content or "") % 2)


async def rewriting_agent(client: Any, task: Any) -> float:
    """The same two calls, then a third that rewrites the history (a fresh conversation of its own):
    each episode is two token sequences, both trained."""
    messages: list[Any] = [{"role": "user", "content": task.prompt}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
    messages += [reply.choices[0].message, {"role": "user", "content": "Again."}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
    fresh = [{"role": "user", "content": f"{task.prompt} Again."}]
    last = await client.chat.completions.create(model=task.model, messages=fresh, max_tokens=4)
    return float(len((reply.choices[0].message.content or "") + (last.choices[0].message.content or "")) % 2)
