"""An agent episode's calls as token sequences, token in, token out: each call's prompt is placed after
an earlier answer when its messages extend that answer's conversation (the ids between are the
environment's, mask 0), else it begins a sequence of its own (the agent rewrote its history).

```
 call(messages, tools) ─► the latest answer whose conversation (messages + that answer) the messages
   extend, with the same tools? ─► its ids (exactly as the engine read and wrote them)
                                    + the template's text after that answer, encoded (mask 0)
                        none ─► the whole conversation rendered and encoded: a new sequence's prompt
 each choice sampled ─► a node: that prompt, the choice's ids (mask 1, their log-probs)
 the episode's sequences: the nodes no later call extended, in order, every one trained; a sampled
   token in the first sequence that holds it (mask 1), context in any later one (mask 0)
```

The text after an answer is read off the template with a sentinel in the answer's place, so the
answer itself is never rendered or encoded again (a tool call the model wrote keeps its exact ids);
the rendering must agree with the prompt the answer was sampled from (`head`), else the call is a
new sequence.

Invariant: a node's `ids[:prompt]` is its sequence's first prompt, and `ids[prompt:]`, `mask` and
`logprobs` line up token for token: 1 and the engine's log-prob on every sampled id, 0 and 0.0 on the
template's and the messages' ids between. Across `sequences()`, every id a call sampled has mask 1 in
exactly one sequence (two calls that went on from the same answer hold its ids both: the later one
as context).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.tokenizer import TextTokenizer
from cadence.model.tool_prompt import family_of
from cadence.model.turns import render
from cadence.rollout.agent.chat import ApiError, Said, canonical, template_messages
from cadence.tasks.tools.calls import Family

SENTINEL = "\x00answer\x00"


class Renderer:
    """A conversation as the chat template's text (without a template: one `role: content` paragraph
    a message, then `assistant: `) and the first prompt's ids; tool calls in the template's `family`."""

    def __init__(self, tokenizer: TextTokenizer, tool_role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.tool_role = tool_role
        self.templated = isinstance(tokenizer, HFTokenizer) and tokenizer.template is not None
        self.eos_text = tokenizer.decode([tokenizer.eos_id], skip_special=False)
        text = tokenizer.template_text if isinstance(tokenizer, HFTokenizer) and self.templated else ""
        self.family: Family = "llama3" if family_of(text) == "llama3" else "hermes"

    def text(self, said: Sequence[Said], tools: Sequence[Mapping[str, Any]] | None, open_turn: bool) -> str:
        messages = template_messages(said, tools, self.tool_role, self.family)
        if self.templated:
            assert isinstance(self.tokenizer, HFTokenizer)
            return render(self.tokenizer, messages, open_turn)
        paragraphs = "".join(f"{m['role']}: {m['content']}\n\n" for m in messages)
        return paragraphs + ("assistant: " if open_turn else "")

    def first(self, text: str) -> list[int]:
        return self._encode(
            lambda: self.tokenizer.encode(text) if self.templated else self.tokenizer.encode_prompt(text)
        )

    def more(self, text: str) -> list[int]:
        return self._encode(lambda: self.tokenizer.encode(text))

    @staticmethod
    def _encode(encode: Any) -> list[int]:
        try:
            return list(encode())
        except ValueError as exc:
            raise ApiError(400, f"the tokenizer cannot take the messages: {exc}", param="messages") from None


@dataclass(frozen=True)
class Node:
    """One answer of the episode: the conversation up to it, and its sequence's ids up to its end."""

    said: tuple[Said, ...]  # canonical messages, the answer last
    tools: str  # the tools' JSON the call was made with
    ids: list[int]
    prompt: int  # ids[:prompt]: the sequence's first prompt
    mask: list[int]
    logprobs: list[float]
    finished: bool  # the answer ended on the model's end of turn
    parent: int | None = None  # the node its call went on from (None: its sequence's first)
    start: int = 0  # ids[start:]: the answer's own sampled ids

    @property
    def sampled(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True)
class Placed:
    """Where a call's prompt goes: after node `parent` (None: a new sequence), and its ids."""

    parent: int | None
    ids: list[int]
    said: tuple[Said, ...]
    tools: str

    def held(self, nodes: Sequence[Node]) -> int:
        """The ids the call's sequence holds after its first prompt, the new ones included."""
        if self.parent is None:
            return 0
        node = nodes[self.parent]
        return len(self.ids) - node.prompt


@dataclass
class Trace:
    """An episode's calls, as the nodes of its sequences."""

    renderer: Renderer
    nodes: list[Node] = field(default_factory=list)
    extended: set[int] = field(default_factory=set)

    def place(self, said: Sequence[Said], tools: Sequence[Mapping[str, Any]] | None) -> Placed:
        """The ids of a call's prompt (`said`, `tools`): after the latest answer it extends, else whole."""
        key = json.dumps(tools or [], sort_keys=True)
        plain = tuple(canonical(s) for s in said)
        for index in reversed(range(len(self.nodes))):
            node = self.nodes[index]
            n = len(node.said)
            if node.tools == key and len(plain) > n and plain[:n] == node.said:
                tail = self._after(node, said, tools)
                if tail is not None:
                    return Placed(index, node.ids + self.renderer.more(tail), plain, key)
        text = self.renderer.text(said, tools, True)
        return Placed(None, self.renderer.first(text), plain, key)

    def _after(
        self, node: Node, said: Sequence[Said], tools: Sequence[Mapping[str, Any]] | None
    ) -> str | None:
        """The template's text after `node`'s answer up to the next answer's beginning; None when the
        template renders the conversation before the answer otherwise than the answer's prompt."""
        n = len(node.said)
        head = self.renderer.text(said[: n - 1], tools, True) + SENTINEL
        marked = [*said[: n - 1], Said("assistant", SENTINEL), *said[n:]]
        whole = self.renderer.text(marked, tools, True)
        if not whole.startswith(head) or whole.count(SENTINEL) != 1:
            return None
        rest = whole[len(head) :]
        eos = self.renderer.eos_text
        if node.finished and eos and rest.startswith(eos):
            rest = rest[len(eos) :]  # the model sampled its end of turn itself
        return rest

    def record(
        self, placed: Placed, answer: Said, tokens: list[int], logprobs: list[float], finished: bool
    ) -> None:
        """One choice sampled after `placed`: a node of its sequence."""
        if placed.parent is None:
            prompt, mask, lps = len(placed.ids), [], []
        else:
            parent = self.nodes[placed.parent]
            self.extended.add(placed.parent)
            between = len(placed.ids) - len(parent.ids)
            prompt, mask, lps = parent.prompt, parent.mask + [0] * between, parent.logprobs + [0.0] * between
        said = (*placed.said, canonical(answer))
        node = Node(
            said,
            placed.tools,
            placed.ids + tokens,
            prompt,
            mask + [1] * len(tokens),
            lps + logprobs,
            finished,
            placed.parent,
            len(placed.ids),
        )
        self.nodes.append(node)

    def sequences(self) -> list[Node]:
        """The episode's sequences, every one trained: each answer no later call went on from, in
        order, with mask 1 only on the sampled ids no earlier sequence holds (an answer two calls
        went on from is trained in the first of their sequences, context in the other)."""
        trained: set[int] = set()
        out = []
        for index, node in enumerate(self.nodes):
            if index in self.extended:
                continue
            mask, logprobs = list(node.mask), list(node.logprobs)
            for answer in self._line(index):
                if answer in trained:
                    own = self.nodes[answer]
                    lo, hi = own.start - node.prompt, len(own.ids) - node.prompt
                    mask[lo:hi], logprobs[lo:hi] = [0] * (hi - lo), [0.0] * (hi - lo)
                trained.add(answer)
            out.append(replace(node, mask=mask, logprobs=logprobs))
        return out

    def _line(self, index: int) -> list[int]:
        """Node `index` and the nodes its sequence went on from, back to the first."""
        line: list[int] = []
        at: int | None = index
        while at is not None:
            line.append(at)
            at = self.nodes[at].parent
        return line

    def kept(self) -> Node | None:
        """The sequence whose messages stand for the episode (its transcript, its last answer): the
        one with the most sampled ids (the latest of equals); None before any answer."""
        leaves = self.sequences()
        return max(reversed(leaves), key=lambda node: node.sampled) if leaves else None
