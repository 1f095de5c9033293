"""A character tokenizer for tiny models and tests.

Invariant: ids are fixed by the alphabet alone (``<pad>``=0, ``<bos>``=1, ``<eos>``=2, then the
alphabet in order), so ``decode(encode(text)) == text`` for every text over the alphabet and a
tokenizer rebuilt from ``to_dict()`` assigns the same ids. Saved beside a checkpoint (``files()``) it
is a Hugging Face ``tokenizers`` file (a WordLevel model over the same ids, one piece a character,
``<bos>`` added before a text) with its ``tokenizer_config.json``, which cadence's `HFTokenizer` and
transformers' ``AutoTokenizer`` read with the same ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class TextTokenizer(Protocol):
    """What the workers and the trainer need of a tokenizer (CharTokenizer, HFTokenizer)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str, bos: bool = False) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

    def decode_response(self, ids: Sequence[int]) -> str: ...

    def files(self) -> dict[str, str]: ...


class CharTokenizer:
    """One id per character of ``alphabet``, after three special tokens."""

    def __init__(self, alphabet: str = "0123456789+-*=?: ") -> None:
        if not alphabet:
            raise ValueError("CharTokenizer alphabet must not be empty")
        repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
        if repeated:
            raise ValueError(f"CharTokenizer alphabet repeats characters: {''.join(repeated)!r}")
        self.alphabet = alphabet
        offset = len(SPECIAL_TOKENS)
        self._ids = {c: i + offset for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = [self.bos_id] if bos else []
        for position, char in enumerate(text):
            token = self._ids.get(char)
            if token is None:
                raise ValueError(
                    f"character {char!r} at position {position} is not in the tokenizer alphabet "
                    f"{self.alphabet!r}"
                )
            ids.append(token)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        offset = len(SPECIAL_TOKENS)
        parts = []
        for token in ids:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")
            if token >= offset:
                parts.append(self.alphabet[token - offset])
            elif not skip_special:
                parts.append(SPECIAL_TOKENS[token])
        return "".join(parts)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as the model sees it: bos, then its characters."""
        return self.encode(text, bos=True)

    def files(self) -> dict[str, str]:
        """The files to save beside a checkpoint so that it loads with this tokenizer: the same ids as a
        Hugging Face tokenizer (`tokenizer.json`) and its special tokens (`tokenizer_config.json`)."""
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)} | self._ids
        hf = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # a piece a character
        hf.decoder = decoders.Fuse()  # pieces joined with nothing between them
        hf.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", self.bos_id)]
        )
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "pad_token": "<pad>",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "add_bos_token": True,
            "clean_up_tokenization_spaces": False,
            "cadence_alphabet": self.alphabet,
        }
        return {"tokenizer.json": hf.to_str(), "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}

    def decode_response(self, ids: Sequence[int]) -> str:
        """A completion as text for scoring: one trailing eos dropped, any other special token shown."""
        body = ids[:-1] if len(ids) and ids[-1] == self.eos_id else ids
        return self.decode(body, skip_special=False)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "alphabet": self.alphabet, "special_tokens": list(SPECIAL_TOKENS)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CharTokenizer:
        if d.get("type", "char") != "char":
            raise ValueError(f"tokenizer type must be 'char', got {d.get('type')!r}")
        if list(d.get("special_tokens", SPECIAL_TOKENS)) != list(SPECIAL_TOKENS):
            raise ValueError(f"tokenizer special_tokens must be {list(SPECIAL_TOKENS)}")
        return cls(str(d["alphabet"]))
