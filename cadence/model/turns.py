"""Chat turns as token ids: the text a tokenizer's chat template puts between the model's turn and its
next one, so an environment's message is appended as ids after the model's own and nothing earlier
is rendered again.

The boundary is read off the template once, by rendering a conversation of sentinels: for ChatML
(SmolLM2) a message `m` after a model turn that ended on its eos `<|im_end|>` is the text
`\\n<|im_start|>user\\n{m}<|im_end|>\\n<|im_start|>assistant\\n`; after a turn cut at its token
limit the boundary begins with the end-of-turn the model did not write: `<|im_end|>\\n<|im_start|>...`.
A tokenizer without a template (the character tokenizer) has no boundary: a message is its own ids.

Invariant: `decode(encode_prompt(first) + turn ids + encode_reply(m, True) + ...)` is the template's
rendering of that conversation, text for text, whenever the template is append-only (a conversation
one turn longer renders as the shorter one plus text at its end); a template that is not (one that
rewrites earlier turns) is refused with `ValueError` when `ChatTurns` is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.tokenizer import TextTokenizer

_FIRST = "\x00first\x00"
_MODEL = "\x00model\x00"
_MESSAGE = "\x00message\x00"


class Message(Protocol):
    """A chat message as an environment's opening gives it (`tasks.environments.base.ChatMessage`)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


class ChatTurns:
    """The `TurnCodec` of `tokenizer`: the environment's messages in the role `role` ("user", or
    "tool" where a template renders tool results apart)."""

    def __init__(self, tokenizer: TextTokenizer, role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.role = role
        self.before, self.after = "", ""  # no template: a message is its own text
        if isinstance(tokenizer, HFTokenizer) and tokenizer.template is not None:
            self.before, self.after = _boundary(tokenizer, role)
        self.eos_text = tokenizer.decode([tokenizer.eos_id], skip_special=False)

    def encode_prompt(self, opening: str | Sequence[Message]) -> list[int]:
        """The first user message, or a conversation ending with it, in the chat template; without a
        template a conversation is its messages' `role: content` paragraphs, as one message."""
        if isinstance(opening, str):
            return self.tokenizer.encode_prompt(opening)
        tokenizer = self.tokenizer
        if isinstance(tokenizer, HFTokenizer) and tokenizer.template is not None:
            messages = [{"role": m.role, "content": m.content} for m in opening]
            return tokenizer.encode(render(tokenizer, messages, True))
        return tokenizer.encode_prompt("\n\n".join(f"{m.role}: {m.content}" for m in opening))

    def encode_reply(self, message: str, finished: bool) -> list[int]:
        before = self.before
        if finished and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]  # the model sampled its end of turn itself
        return self.tokenizer.encode(before + message + self.after)

    def decode_response(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode_response(ids)


def render(tokenizer: HFTokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The template's text of `messages`, with the arguments `HFTokenizer.encode_prompt` gives it."""
    assert tokenizer.template is not None
    config: dict[str, Any] = tokenizer.config
    return str(
        tokenizer.template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=config.get("bos_token", ""),
            eos_token=config.get("eos_token", ""),
        )
    )


def _boundary(tokenizer: HFTokenizer, role: str) -> tuple[str, str]:
    """(the text from the model turn's content to the message's, the text from the message's to the
    next model turn's), read off one conversation of sentinels; `ValueError` when the template is not
    append-only."""
    first = [{"role": "user", "content": _FIRST}]
    prompt = render(tokenizer, first, True)
    model = {"role": "assistant", "content": _MODEL}
    full = render(tokenizer, [*first, model, {"role": role, "content": _MESSAGE}], True)
    if not full.startswith(prompt + _MODEL) or full.count(_MESSAGE) != 1:
        raise ValueError(
            f"{tokenizer.directory}: the chat template does not render a conversation as its first"
            " message's prompt followed by the rest, so turns cannot be appended as token ids"
        )
    before, after = full[len(prompt) + len(_MODEL) :].split(_MESSAGE)
    return before, after
