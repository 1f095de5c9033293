"""The final folder of a LoRA run opened by peft on the base's Hugging Face model: the same greedy
tokens as cadence's engine with that version loaded, and as the model `cadence model merge` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.cli import main
from cadence.model.checkpoint import load_checkpoint, save_checkpoint
from cadence.model.config import ModelConfig
from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.lora import LoraSpec
from cadence.model.lora_engine import LoraRolloutEngine
from cadence.model.lora_files import checkpoint_identity
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.training.lora_learner import LoraLearner

transformers = pytest.importorskip("transformers", reason="the PEFT folder is opened with transformers")
peft = pytest.importorskip("peft", reason="the PEFT folder is opened with peft")

CFG = ModelConfig(
    vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
)
SPEC = LoraSpec(rank=4, alpha=16.0, targets=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"))
EOS = 2
PROMPTS = ([1, 5, 9], [3, 14, 15, 9, 26, 35, 8])
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def trained(base: Path) -> LoraLearner:
    """A learner on the base checkpoint whose adapters are far from zero (B random), as a trained one."""
    model, cfg = load_checkpoint(base)
    settings: dict[str, Any] = dict(lr=1e-3, weight_decay=0.0, clip_low=0.2, clip_high=0.28, kl_beta=0.0)
    learner = LoraLearner(
        model,
        cfg,
        CharTokenizer(),
        lora=SPEC,
        seed=4,
        base=checkpoint_identity(base),
        base_path=str(base),
        max_grad_norm=1.0,
        **settings,
    )
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in learner.tensors().items():
            if name.endswith("lora_B.weight"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return learner


def hf_greedy(model: Any, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=GREEDY.max_new_tokens,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def test_peft_opens_the_final_folder_and_generates_cadences_greedy_tokens(tmp_path: Path) -> None:
    base = tmp_path / "base"
    save_checkpoint(init_model(CFG, seed=1), CFG, base, CharTokenizer().files())
    learner = trained(base)
    learner.save(tmp_path / "final")
    engine = LoraRolloutEngine(
        TorchRolloutEngine(TorchEngine(load_checkpoint(base)[0], eos_id=EOS), GREEDY), SPEC, learner.base
    )
    engine.load(learner.weights())
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    plain = [hf_greedy(hf, prompt) for prompt in PROMPTS]
    adapted = peft.PeftModel.from_pretrained(hf, tmp_path / "final").eval()
    ours = [engine.generate(prompt, [0])[0].tokens for prompt in PROMPTS]
    assert [hf_greedy(adapted, prompt) for prompt in PROMPTS] == ours
    assert ours != plain  # the adapters change what is generated: the check has teeth

    assert main(["model", "merge", str(tmp_path / "final"), "--out", str(tmp_path / "merged")]) == 0
    merged = TorchEngine(load_checkpoint(tmp_path / "merged")[0], eos_id=EOS)
    assert [merged.generate(prompt, [0], GREEDY)[0].tokens for prompt in PROMPTS] == ours
    assert (tmp_path / "merged" / "tokenizer.json").is_file()


def test_merge_refuses_an_adapter_folder_that_names_no_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base"
    save_checkpoint(init_model(CFG, seed=1), CFG, base, CharTokenizer().files())
    learner = trained(base)
    learner.base_path = None
    learner.save(tmp_path / "final")
    assert main(["model", "merge", str(tmp_path / "final"), "--out", str(tmp_path / "merged")]) == 2
    assert "names no base_model_name_or_path: give --base" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()
