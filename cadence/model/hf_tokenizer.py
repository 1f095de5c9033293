"""A Hugging Face checkpoint's tokenizer with `tokenizers` and its chat template with jinja2.

Invariant: `encode_prompt(text)` gives the ids transformers' `apply_chat_template` gives for one user
message with the generation prompt added (without a template: the text, after the bos token when
`add_bos_token` says so); special tokens come from `tokenizer_config.json`, the template from
`chat_template.jinja` or the config's `chat_template`. No transformers at run time. `open_tokenizer`
also reads the character tokenizer files of checkpoints saved by cadence before it wrote HF ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from cadence.model.tokenizer import CharTokenizer, TextTokenizer


def open_tokenizer(directory: Path) -> TextTokenizer:
    """The tokenizer of checkpoint folder `directory`: its HF `tokenizer.json`, or the character
    tokenizer of an older cadence checkpoint; `ValueError` naming the file it cannot read."""
    path = Path(directory) / "tokenizer.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} not found") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is empty or damaged, not JSON ({exc})") from None
    if isinstance(data, dict) and data.get("type") == "char":
        return CharTokenizer.from_dict(data)
    return HFTokenizer(Path(directory))


class HFTokenizer:
    def __init__(self, directory: Path) -> None:
        directory = Path(directory)
        self.directory = directory
        try:
            self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library names no file
            raise ValueError(f"{directory / 'tokenizer.json'} cannot be read: {exc}") from None
        config_path = directory / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = directory / "chat_template.jinja"
        template = template_path.read_text() if template_path.exists() else self.config.get("chat_template")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )
        env.globals["raise_exception"] = _raise  # what transformers gives templates (Qwen's, Llama's)
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(template) if isinstance(template, str) else None
        self.template_text = template if isinstance(template, str) else ""
        self._plain: Tokenizer | None = None
        self.eos_id = self._special("eos_token")
        self.bos_id = self._special("bos_token", default=self.eos_id)
        self.pad_id = self._special("pad_token", default=self.eos_id)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def _special(self, key: str, default: int | None = None) -> int:
        token = self.config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        found = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
        if found is not None:
            return int(found)
        if default is not None:
            return default
        raise ValueError(f"{self.directory}: tokenizer_config.json names no usable {key}")

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return [self.bos_id, *ids] if bos else ids

    def encode_plain(self, text: str) -> list[int]:
        """`text`'s ids with every special token's text in it encoded as plain text (`<|im_end|>` as
        the characters `<`, `|`, ..., never the end of a turn): how text from outside is encoded."""
        if self._plain is None:
            self._plain = Tokenizer.from_str(self.tokenizer.to_str())
            self._plain.encode_special_tokens = True
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def holds_special(self, text: str) -> bool:
        """Whether `text` holds the text of one of the tokenizer's special tokens."""
        added = self.tokenizer.get_added_tokens_decoder().values()
        return any(token.special and token.content in text for token in added)

    def encode_prompt(self, text: str) -> list[int]:
        """One user message in the chat template, ready for the assistant's answer."""
        if self.template is None:
            return self.encode(text, bos=self.config.get("add_bos_token") is True)
        rendered = self.template.render(
            messages=[{"role": "user", "content": text}],
            add_generation_prompt=True,
            bos_token=self.config.get("bos_token", ""),
            eos_token=self.config.get("eos_token", ""),
        )
        return self.encode(rendered)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special))

    def decode_response(self, ids: Sequence[int]) -> str:
        """A completion as text for scoring: one trailing eos dropped, other special tokens shown."""
        body = ids[:-1] if len(ids) and ids[-1] == self.eos_id else ids
        return self.decode(body, skip_special=False)

    def files(self) -> dict[str, str]:
        """The files to save beside a checkpoint so that it loads with this tokenizer."""
        names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
        return {n: (self.directory / n).read_text() for n in names if (self.directory / n).exists()}


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)
