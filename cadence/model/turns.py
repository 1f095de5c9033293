"""Chat turns as token ids: the text a tokenizer's chat template puts between the model's turn and its
next one, so an environment's message is appended as ids after the model's own and nothing earlier
is rendered again.

The boundary is read off the template once, by rendering a conversation of sentinels: for ChatML
(SmolLM2) a message `m` after a model turn that ended on its eos `<|im_end|>` is the text
`\\n<|im_start|>user\\n{m}<|im_end|>\\n<|im_start|>assistant\\n`; after a turn cut at its token
limit the boundary begins with the end-of-turn the model did not write: `<|im_end|>\\n<|im_start|>...`.
A tokenizer without a template (the character tokenizer) has no boundary: a message is its own ids.
Tool results are the template's `tool` messages, one a call (`encode_results`), their boundary read
off a conversation of as many sentinel tool messages; tools are declared in the opening by the
template's own `tools` support, else by a Hermes-style system block (`tool_prompt.py`).

Text is never control: an environment's text that holds a special token's text (`<|im_end|>`) is
encoded as plain text, so it cannot end a turn or open one; the template's own markers around it are
the special tokens. Text without any is encoded with the template's text around it in one piece, as
`apply_chat_template` would.

Invariant: `decode(encode_prompt(first) + turn ids + encode_reply(m, True) + ...)` is the template's
rendering of that conversation, text for text, whenever the template is append-only (a conversation
one turn longer renders as the shorter one plus text at its end); a template that is not (one that
rewrites earlier turns) is refused with `ValueError` when `ChatTurns` is made. The runner never
renders a conversation again, so a template that would render earlier turns otherwise later (one that
drops past `<think>` blocks) does not change the ids of what was sampled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.tokenizer import TextTokenizer
from cadence.model.tool_prompt import family_of, renders_tools, tools_block, with_tools

_FIRST = "\x00first\x00"
_MODEL = "\x00model\x00"
_MARK = re.compile("\x00mark(\\d+)\x00")

Schemas = Sequence[Mapping[str, Any]]


class Message(Protocol):
    """A chat message as an environment's opening gives it (`tasks.environments.base.ChatMessage`)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


class ChatTurns:
    """The `TurnCodec` of `tokenizer`: the environment's messages in the role `role` ("user", or
    "tool" where a template renders tool results apart), tool results in the role "tool"."""

    def __init__(self, tokenizer: TextTokenizer, role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.role = role
        self.template = tokenizer if isinstance(tokenizer, HFTokenizer) and tokenizer.template else None
        self.pieces = ["", ""]  # no template: a message is its own text
        if self.template is not None:
            self.pieces = _boundary(self.template, [role])
        self.tool_format = family_of(self.template.template_text) if self.template else "hermes"
        self._tool_pieces: dict[int, list[str]] = {}
        self.eos_text = tokenizer.decode([tokenizer.eos_id], skip_special=False)

    @property
    def before(self) -> str:
        return self.pieces[0]

    @property
    def after(self) -> str:
        return self.pieces[-1]

    def encode_prompt(self, opening: str | Sequence[Message], tools: Schemas = ()) -> list[int]:
        """The first user message, or a conversation ending with it, in the chat template, with `tools`
        declared; without a template a conversation is its messages' `role: content` paragraphs."""
        if isinstance(opening, str) and not tools and not self._holds_special([opening]):
            return self.tokenizer.encode_prompt(opening)
        listed = [("user", opening)] if isinstance(opening, str) else [(m.role, m.content) for m in opening]
        messages = [{"role": role, "content": content} for role, content in listed]
        if self.template is None:
            if tools:
                messages = [{"role": "system", "content": tools_block(tools)}, *messages]
            text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
            if isinstance(self.tokenizer, HFTokenizer):
                bos = [self.tokenizer.bos_id] if self.tokenizer.config.get("add_bos_token") is True else []
                return bos + self.tokenizer.encode_plain(text)
            return self.tokenizer.encode_prompt(text)
        messages = with_tools(messages, tools, self.template.template_text)
        shown = tools if tools and renders_tools(self.template.template_text) else None
        return _encode_conversation(self.template, messages, shown)

    def encode_reply(self, message: str, finished: bool) -> list[int]:
        return self._join(self.pieces, [message], finished)

    def encode_results(self, results: Sequence[str], finished: bool) -> list[int]:
        """The ids between the model's turn and its next one around `results`, one `tool` message
        each; without a template, the results one a line."""
        if self.template is None:
            return self._join(["", *["\n"] * (len(results) - 1), ""], results, finished)
        if len(results) not in self._tool_pieces:
            self._tool_pieces[len(results)] = _boundary(self.template, ["tool"] * len(results))
        return self._join(self._tool_pieces[len(results)], results, finished)

    def decode_response(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode_response(ids)

    def _join(self, pieces: Sequence[str], contents: Sequence[str], finished: bool) -> list[int]:
        """The template's `pieces` around `contents` (one fewer), as ids; the first piece without
        the model's eos when `finished` (the model sampled its end of turn itself)."""
        first = pieces[0]
        if finished and first.startswith(self.eos_text):
            first = first[len(self.eos_text) :]
        pieces = [first, *pieces[1:]]
        if not self._holds_special(contents):
            return self.tokenizer.encode("".join(_interleave(pieces, contents)))
        assert isinstance(self.tokenizer, HFTokenizer)  # only its texts hold special tokens
        return _encode_apart(self.tokenizer, pieces, contents)

    def _holds_special(self, texts: Sequence[str]) -> bool:
        tokenizer = self.tokenizer
        return isinstance(tokenizer, HFTokenizer) and any(tokenizer.holds_special(t) for t in texts)


def render(
    tokenizer: HFTokenizer,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
    tools: Schemas | None = None,
) -> str:
    """The template's text of `messages`, with the arguments `HFTokenizer.encode_prompt` gives it
    (and `tools`, for a template that renders them)."""
    assert tokenizer.template is not None
    config: dict[str, Any] = tokenizer.config
    return str(
        tokenizer.template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=config.get("bos_token", ""),
            eos_token=config.get("eos_token", ""),
            tools=list(tools) if tools else None,
        )
    )


def _interleave(pieces: Sequence[str], contents: Sequence[str]) -> list[str]:
    out = [pieces[0]]
    for content, piece in zip(contents, pieces[1:], strict=True):
        out += [content, piece]
    return out


def _encode_apart(tokenizer: HFTokenizer, pieces: Sequence[str], contents: Sequence[str]) -> list[int]:
    """The template's pieces with their special tokens, each content as plain text between them."""
    ids = tokenizer.encode(pieces[0])
    for content, piece in zip(contents, pieces[1:], strict=True):
        ids += tokenizer.encode_plain(content) + tokenizer.encode(piece)
    return ids


def _encode_conversation(
    tokenizer: HFTokenizer, messages: list[dict[str, str]], tools: Schemas | None
) -> list[int]:
    """A whole opening in the template: in one piece, as `apply_chat_template` gives it, unless a
    message holds a special token's text; then each message's content as plain text between the
    template's pieces (read off the rendering of numbered sentinels), or `ValueError` where the
    template changes a content so that it cannot be placed."""
    text = render(tokenizer, messages, True, tools)
    contents = [m["content"] for m in messages]
    if not any(tokenizer.holds_special(c) for c in contents):
        return tokenizer.encode(text)
    marked = [{**m, "content": f"\x00mark{i}\x00"} for i, m in enumerate(messages)]
    split = _MARK.split(render(tokenizer, marked, True, tools))
    order = [int(i) for i in split[1::2]]
    placed = [contents[i] for i in order]
    if order != list(range(len(messages))) or "".join(_interleave(split[0::2], placed)) != text:
        raise ValueError(
            "a message holds a special token's text and the chat template changes message contents,"
            " so it cannot be encoded as plain text"
        )
    return _encode_apart(tokenizer, split[0::2], placed)


def _boundary(tokenizer: HFTokenizer, roles: Sequence[str]) -> list[str]:
    """The template's text around messages in `roles` after a model turn: [from the model turn's
    content to the first message's, between each two, from the last to the next model turn's], read
    off one conversation of sentinels; `ValueError` when the template is not append-only."""
    first = [{"role": "user", "content": _FIRST}]
    prompt = render(tokenizer, first, True)
    model = {"role": "assistant", "content": _MODEL}
    marks = [f"\x00mark{i}\x00" for i in range(len(roles))]
    full = render(
        tokenizer,
        [*first, model, *({"role": r, "content": m} for r, m in zip(roles, marks, strict=True))],
        True,
    )
    if not full.startswith(prompt + _MODEL) or any(full.count(mark) != 1 for mark in marks):
        raise ValueError(
            f"{tokenizer.directory}: the chat template does not render a conversation as its first"
            " message's prompt followed by the rest, so turns cannot be appended as token ids"
        )
    rest = full[len(prompt) + len(_MODEL) :]
    pieces = []
    for mark in marks:
        piece, rest = rest.split(mark)
        pieces.append(piece)
    return [*pieces, rest]
