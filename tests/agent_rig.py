"""What the tests of agent episodes share: a checkpoint folder with a byte-level tokenizer (every text
round-trips), ChatML's template and a tiny random model, and an engine on it that keeps every sample."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from cadence.model.checkpoint import load_checkpoint, save_checkpoint
from cadence.model.config import ModelConfig
from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.transformer import init_model
from tests.turns import RecordingTurns

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_checkpoint(directory: Path, max_position: int = 512, seed: int = 5) -> Path:
    """A checkpoint in `directory`: one token a byte, ChatML's specials and template, a tiny model."""
    vocab = {token: i for i, token in enumerate(SPECIAL)}
    for char in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(char, len(vocab))
    tok = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    model_cfg = ModelConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, max_position=max_position
    )
    save_checkpoint(init_model(model_cfg, seed), model_cfg, directory)
    return directory


def recording_engine(directory: Path, max_new_tokens: int = 16, temperature: float = 1.0) -> RecordingTurns:
    """The checkpoint's model on the built-in engine, keeping every sample by its seed."""
    model, _ = load_checkpoint(directory)
    tokenizer = HFTokenizer(directory)
    engine = TorchEngine(model, tokenizer.eos_id)
    return RecordingTurns(TorchRolloutEngine(engine, SamplingParams(max_new_tokens, temperature)))
