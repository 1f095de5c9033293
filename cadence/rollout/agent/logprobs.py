"""A choice's log-probs in OpenAI's form (`choices[i].logprobs.content`, asked with `logprobs: true`):
one entry a sampled id of the choice's `token_ids`, its text, the engine's own log-prob (the one the
trainer's ratio uses, `token_logprobs`) and the text's UTF-8 bytes; no alternatives (`top_logprobs`
empty: the engine gives the sampled token's alone, so `top_logprobs` > 0 is refused).

A token's text is what it adds to the decoded text (special tokens written out, `<|im_end|>`); a
character whose bytes span several tokens is given whole with the token that completes it (the ones
before it have the text "").

Invariant: one entry a sampled id, in order; the entries' texts joined are the choice's ids decoded
(special tokens written out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cadence.model.tokenizer import TextTokenizer

CONTEXT = 4  # ids decoded before a token's own, so that a decoder's leading-space rule sees them
INCOMPLETE = "\ufffd"


def token_texts(tokenizer: TextTokenizer, ids: Sequence[int]) -> list[str]:
    """What each of `ids` adds to their decoded text."""
    texts: list[str] = []
    start = 0  # the first id whose text is not given yet
    for i in range(len(ids)):
        before_at = max(0, start - CONTEXT)
        before = tokenizer.decode(ids[before_at:start], skip_special=False)
        now = tokenizer.decode(ids[before_at : i + 1], skip_special=False)
        if now.endswith(INCOMPLETE) and i + 1 < len(ids):
            texts.append("")  # a character not complete yet
            continue
        texts.append(now[len(before) :] if now.startswith(before) else now)
        start = i + 1
    return texts


def content(tokenizer: TextTokenizer, ids: Sequence[int], logprobs: Sequence[float]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` of a choice's sampled `ids` and their `logprobs`."""
    return [
        {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []}
        for text, logprob in zip(token_texts(tokenizer, ids), logprobs, strict=True)
    ]
