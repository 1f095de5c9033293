"""A trainer's files: a Hugging Face checkpoint of its weights, and the resumable state (weights,
optimizer, random generators) that lets a trainer continue exactly where one stopped."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cadence.model.checkpoint import save_checkpoint, state_dict_from_bytes, tensors_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.tokenizer import TextTokenizer
from cadence.wire.buffer import Buffer
from cadence.wire.digest import checksum


def write_checkpoint(
    weights: Mapping[str, Tensor], model_cfg: ModelConfig, tokenizer: TextTokenizer, directory: Path
) -> str:
    """A Hugging Face checkpoint folder of `weights` (HF-named); the checksum of their safetensors bytes."""
    save_checkpoint(weights, model_cfg, directory, tokenizer.files())
    return checksum(tensors_to_bytes(weights))


def write_state(directory: Path, weights: bytes | Buffer, optimizer: dict[str, Any]) -> None:
    """A resumable state: `model.safetensors` (the policy), `optimizer.pt` (AdamW's state_dict: moments
    and step counts by parameter index), `rng.pt` (torch's and Python's generators). The frozen
    reference is rebuilt from the config."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(weights)
    torch.save(optimizer, directory / "optimizer.pt")
    version, internal, gauss = random.getstate()
    rng = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    torch.save(rng, directory / "rng.pt")


def read_state(directory: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """What `write_state` wrote: the weights and the optimizer state; the generators are restored."""
    weights = state_dict_from_bytes((directory / "model.safetensors").read_bytes())
    optimizer = torch.load(directory / "optimizer.pt", weights_only=True)
    rng = torch.load(directory / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    return weights, optimizer
