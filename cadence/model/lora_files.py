"""Adapters as bytes and files: a version's safetensors bytes, the PEFT adapter folder, the base's identity.

```
 version bytes   safetensors of the adapters (`…q_proj.lora_A.weight`), header metadata:
                 lora_rank, lora_alpha, lora_base (the base's identity): the version digest covers all
 PEFT folder     adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, …) and
                 adapter_model.safetensors (`base_model.model.` + each name, lora_base in its metadata)
 base identity   xxh3-128 of the checkpoint's config.json and weight files, or of the random model's
                 config and init seed
```

Invariant: an adapter read back (from a version's bytes or a PEFT folder) has the names, values and
spec it was written with, and carries the identity of the base it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch import Tensor

from cadence.model.checkpoint import (
    Layout,
    _write_atomic,
    safetensors_metadata,
    state_dict_from_bytes,
    tensors_layout,
    tensors_to_bytes,
    write_safetensors,
)
from cadence.model.config import ModelConfig
from cadence.model.lora import TARGETS, LoraSpec, adapter_pairs
from cadence.wire.buffer import Buffer

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_READ_BYTES = 1 << 24


def checkpoint_identity(directory: Path) -> str:
    """The base's identity for a checkpoint folder: xxh3-128 over its config.json and weight files, in
    name order (read in chunks: a 135M model's 270 MB in about a tenth of a second)."""
    digest = xxhash.xxh3_128()
    names = sorted(
        p.name for p in directory.iterdir() if p.name == "config.json" or p.name.endswith(".safetensors")
    )
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(directory / name, "rb") as f:
            while chunk := f.read(_READ_BYTES):
                digest.update(chunk)
    return digest.hexdigest()


def init_identity(cfg: ModelConfig, seed: int) -> str:
    """The base's identity for a random model: its config and init seed."""
    text = json.dumps({"config": cfg.to_hf_dict(), "init_seed": seed}, sort_keys=True)
    return xxhash.xxh3_128_hexdigest(text.encode())


def spec_metadata(spec: LoraSpec, base: str) -> dict[str, str]:
    return {"lora_rank": str(spec.rank), "lora_alpha": repr(spec.alpha), "lora_base": base}


def adapter_bytes(
    adapters: Mapping[str, Tensor],
    spec: LoraSpec,
    base: str,
    alloc: Callable[[int], Buffer] = bytearray,
    dtype: torch.dtype | str | None = None,
) -> Buffer:
    """A version: the adapters' safetensors bytes (in `dtype` where given), the spec and the base's
    identity in the header."""
    return write_safetensors(adapter_layout(adapters, spec, base, dtype), alloc)


def adapter_layout(
    adapters: Mapping[str, Tensor], spec: LoraSpec, base: str, dtype: torch.dtype | str | None = None
) -> Layout:
    """The layout `adapter_bytes` writes (kept by a learner: each version one concatenation)."""
    return tensors_layout(adapters, dtype, spec_metadata(spec, base))


def read_adapter_bytes(data: bytes | Buffer) -> tuple[dict[str, Tensor], float, str]:
    """A version's adapters, scale (alpha / rank) and base identity; ValueError for bytes that are no
    adapter version (a full model's, or adapters that do not pair)."""
    meta = safetensors_metadata(data)
    if "lora_base" not in meta:
        raise ValueError("a version without adapters (no lora_base in its header): a full model's weights?")
    try:
        scale = float(meta["lora_alpha"]) / int(meta["lora_rank"])
    except (KeyError, ValueError, ZeroDivisionError):
        raise ValueError(f"a version whose lora_rank/lora_alpha cannot be read: {meta}") from None
    adapters = state_dict_from_bytes(data)
    adapter_pairs(adapters)  # every A with its B
    return adapters, scale, meta["lora_base"]


def peft_config(spec: LoraSpec, modules: list[str], base_path: str | None) -> dict[str, Any]:
    """PEFT's `adapter_config.json` of `spec`, `modules` the targets that are present."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(set(modules)),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def write_peft(
    directory: Path, adapters: Mapping[str, Tensor], spec: LoraSpec, base: str, base_path: str | None
) -> Buffer:
    """The PEFT adapter folder of `adapters` in `directory` (created); the weight file's bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    named = {PEFT_PREFIX + name: t.detach() for name, t in adapters.items()}
    data = tensors_to_bytes(named, metadata=spec_metadata(spec, base))
    modules = sorted({name.rsplit(".", 3)[-3] for name in adapters})
    _write_atomic(directory / ADAPTER_WEIGHTS, data)
    text = json.dumps(peft_config(spec, modules, base_path), indent=2) + "\n"
    _write_atomic(directory / ADAPTER_CONFIG, text.encode())
    return data


def is_peft_folder(directory: Path) -> bool:
    return (directory / ADAPTER_CONFIG).is_file()


def read_peft(directory: Path) -> tuple[dict[str, Tensor], LoraSpec, dict[str, Any]]:
    """A PEFT LoRA folder's adapters (cadence's names, without `base_model.model.`), spec and config;
    ValueError naming the file for what cadence cannot apply (another peft_type, rsLoRA, DoRA, biases)."""
    path = directory / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    for key, wanted in (("peft_type", "LORA"), ("use_rslora", False), ("use_dora", False), ("bias", "none")):
        if config.get(key, wanted) != wanted:
            raise ValueError(f"{path}: {key} = {config.get(key)!r}, cadence applies only {wanted!r}")
    data = (directory / ADAPTER_WEIGHTS).read_bytes()
    tensors = state_dict_from_bytes(data)
    adapters = {name.removeprefix(PEFT_PREFIX): t for name, t in tensors.items()}
    adapter_pairs(adapters)
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(
            f"{path}: target_modules {unknown} are none of cadence's projections {list(TARGETS)}"
        )
    ordered = tuple(t for t in TARGETS if t in targets)
    spec = LoraSpec(
        int(config["r"]), float(config["lora_alpha"]), float(config.get("lora_dropout", 0.0)), ordered
    )
    return adapters, spec, config


def merge_folder(adapter_dir: Path, base_dir: Path | None, out: Path) -> Path:
    """Write into `out` the full model of the PEFT folder `adapter_dir` merged into its base
    (`base_dir`, else the folder its adapter_config.json names): a checkpoint folder with the base's
    config, its other files (tokenizer, …) copied, and the merged weights in the base's dtype."""
    from cadence.model.checkpoint import CheckpointError, check_checkpoint, load_checkpoint, save_checkpoint
    from cadence.model.hf_state import hf_state_dict
    from cadence.model.lora import merge_adapters

    adapters, spec, config = read_peft(adapter_dir)
    named = config.get("base_model_name_or_path")
    base = base_dir if base_dir is not None else Path(named) if named else None
    if base is None:
        raise CheckpointError(f"{adapter_dir / ADAPTER_CONFIG} names no base_model_name_or_path: give --base")
    check_checkpoint(base)
    if out.resolve() in (base.resolve(), adapter_dir.resolve()):
        raise CheckpointError(f"{out} is the base or adapter folder itself: give another --out")
    model, model_cfg = load_checkpoint(base, dtype="auto")
    merged = merge_adapters(hf_state_dict(model), adapters, spec.scale)
    skip = {"config.json", "model.safetensors.index.json", ADAPTER_CONFIG}
    extra = {
        p.name: p.read_text()
        for p in sorted(base.iterdir())
        if p.is_file() and p.name not in skip and p.suffix in (".json", ".txt", ".model", ".jinja")
    }
    save_checkpoint(merged, model_cfg, out, extra)
    return out
