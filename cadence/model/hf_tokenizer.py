"""A Hugging Face checkpoint's tokenizer with `tokenizers` and its chat template with jinja2.

Invariant: `encode_prompt(text)` gives the ids transformers' `apply_chat_template` gives for one user
message with the generation prompt added; special tokens come from `tokenizer_config.json`, the
template from `chat_template.jinja` or the config's `chat_template`. No transformers at run time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class HFTokenizer:
    def __init__(self, directory: Path) -> None:
        directory = Path(directory)
        self.directory = directory
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = directory / "chat_template.jinja"
        template = template_path.read_text() if template_path.exists() else self.config.get("chat_template")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )
        self.template = env.from_string(template) if isinstance(template, str) else None
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

    def encode_prompt(self, text: str) -> list[int]:
        """One user message in the chat template, ready for the assistant's answer."""
        if self.template is None:
            return self.encode(text)
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
