"""What the tool tests share: a scripted model over a real tokenizer (the only fake: the generate
function at the edge), SmolLM2's tokenizer folder, and a copy of it with a chat template of the test's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.tasks.environments.generation import Generated, turn_seed

SMOLLM2 = Path.home() / ".cache" / "cadence" / "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(),
    reason=f"SmolLM2's tokenizer is not at {SMOLLM2} (`make smollm2` puts it there)",
)


def with_template(folder: Path, template: str) -> HFTokenizer:
    """SmolLM2's tokenizer with `template` as its chat template, in `folder`."""
    shutil.copy(SMOLLM2 / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((SMOLLM2 / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return HFTokenizer(folder)


class Scripted:
    """A model that writes each episode's scripted turns (by its sample seed) with `tokenizer`, ending
    each on eos; every context it was asked with is kept, by turn seed."""

    max_context = 100_000

    def __init__(self, tokenizer: HFTokenizer, scripts: dict[int, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.turns = {turn_seed(seed, t): (seed, t) for seed in scripts for t in range(50)}
        self.scripts = scripts
        self.asked: dict[int, list[int]] = {}
        self.sampled: dict[int, list[int]] = {}

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        out = []
        for prompt, seed, limit in zip(prompts, seeds, max_new_tokens, strict=True):
            episode, turn = self.turns[seed]
            texts = self.scripts[episode]
            ids = [*self.tokenizer.encode(texts[min(turn, len(texts) - 1)]), self.tokenizer.eos_id][:limit]
            self.asked[seed], self.sampled[seed] = list(prompt), ids
            out.append(Generated(ids, [-0.5] * len(ids), ids[-1] == self.tokenizer.eos_id))
        return out
