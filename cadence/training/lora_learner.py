"""The learner with low-rank adapters (`[trainer.lora]`): the base frozen, the adapters trained.

```
 LoraLearner(model, …, lora=spec, seed, base) ─► apply_lora: target projections adapted, the rest frozen
   train_groups, step        as TorchLearner's, AdamW over the adapters alone (TorchLearner.trainable)
   weights() / tensors()     a version: the adapters alone, with the spec and the base's identity
   save(final)               a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)
   save_state / load_state   the adapters, AdamW's state over them, the generators: resume exact
   base_dtype = "bfloat16"   the adapted projections' frozen weights held in bf16 (bf16 autocast only)
```

Invariant: the base weights never change; every published version, resume state and final folder
holds the adapters and names the base they apply to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cadence.model.checkpoint import Layout, write_safetensors
from cadence.model.config import ModelConfig
from cadence.model.lora import LoraLinear, LoraSpec, adapter_tensors, apply_lora, trainable_count
from cadence.model.lora_files import adapter_layout, write_peft
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import Transformer
from cadence.training.learner import TorchLearner
from cadence.training.state import write_state
from cadence.wire.buffer import Buffer
from cadence.wire.digest import checksum


class LoraLearner(TorchLearner):
    """`lora`: the adapters' shape; `seed`: their A's draw; `base`: the base's identity
    (model/lora_files.py); `base_path`: the base checkpoint's folder, for the PEFT folder's config."""

    def __init__(
        self,
        model: Transformer,
        model_cfg: ModelConfig,
        tokenizer: TextTokenizer,
        *,
        lora: LoraSpec,
        seed: int,
        base: str,
        base_path: str | None = None,
        base_dtype: str = "float32",
        **settings: Any,
    ) -> None:
        apply_lora(model, lora, seed)
        if base_dtype == "bfloat16":
            if settings.get("precision") != "bf16":
                raise ValueError("trainer.lora.base_dtype = 'bfloat16' needs trainer.precision = 'bf16'")
            hold_bases_in_bf16(model)
        elif base_dtype != "float32":
            raise ValueError(f"trainer.lora.base_dtype must be 'float32' or 'bfloat16', got {base_dtype!r}")
        self.lora = lora
        self._adapters: dict[str, Tensor] | None = None
        self._layout: tuple[str | None, Layout] | None = None  # the last version's, for its dtype
        self.base = base
        self.base_path = base_path
        super().__init__(model, model_cfg, tokenizer, **settings)

    @property
    def trainable_parameters(self) -> int:
        return trainable_count(self.model)

    def tensors(self) -> dict[str, Tensor]:
        """The adapters, live: found once (a walk over the model's parameters costs a version 1 ms);
        they stay the same tensors, written in place by the optimizer and by `load`."""
        if self._adapters is None:
            self._adapters = adapter_tensors(self.model)
        return self._adapters

    def stage(self, alloc: Callable[[int], Buffer], dtype: str | None = None) -> str | None:
        """Nothing is staged: a version is the adapters alone, one concatenation of a kept layout."""
        return "a LoRA version is written from its kept layout"

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes | Buffer:
        """A version: the adapters' bytes (`adapter_bytes`), through a layout kept while they are the
        same tensors and dtype: each version is then one concatenation into `alloc`'s buffer, with
        no walk over 420 tensors and no header to encode again (1.5 ms of Python a version, which
        the run's event loop could stretch by its turns with the GIL)."""
        adapters = self.tensors()
        kept = self._layout
        if kept is None or kept[0] != dtype or not kept[1].holds(adapters):
            kept = self._layout = (dtype, adapter_layout(adapters, self.lora, self.base, dtype))
        return write_safetensors(kept[1], alloc)

    def load(self, weights: Any, optimizer: dict[str, Any] | None) -> None:
        """Replace the adapters (exactly the model's adapter names) and AdamW's state."""
        if weights is None or optimizer is None:
            raise ValueError("one rank's learner loads the whole state")
        own = self.tensors()
        if set(weights) != set(own):
            missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
            raise ValueError(
                f"a resume state whose adapters differ: missing {missing[:3]}, unexpected {extra[:3]}"
            )
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(weights[name])
        self.optimizer.load_state_dict(optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self._sums = {}

    def save(self, directory: Path) -> str:
        """The PEFT adapter folder; the checksum of its weight file's bytes."""
        data = write_peft(directory, self.tensors(), self.lora, self.base, self.base_path)
        for name, text in self.tokenizer.files().items():
            (directory / name).write_text(text)
        return checksum(data)

    def save_state(self, directory: Path) -> None:
        write_state(directory, self.weights(), self.optimizer_state())


def hold_bases_in_bf16(model: Transformer) -> None:
    """Each adapted projection's frozen base weight held in bfloat16: half its bytes in the learner
    (and its reference). Under bf16 autocast a product rounds a float32 weight to bfloat16 as it runs,
    the same rounding as this one: the forward, the loss and the adapters' gradients are unchanged."""
    for module in model.modules():
        if isinstance(module, LoraLinear):
            module.weight.requires_grad_(False)
            module.weight.data = module.weight.data.to(torch.bfloat16)
