"""The built-in engine taking adapter versions: each merged into its own copy of the base on load.

```
 LoraRolloutEngine(engine, spec, base)   holds the base's tensors as the engine first had them
   load(bytes)        adapters, scale and base identity from the version's header (lora_files.py);
                      refused when trained on another base
   load_state(tensors) adapters received by broadcast, at the spec's scale
   ─► each target W = base W + scale B A (float32, then the engine's dtype), recomputed from the base
      every version, never accumulated, into the same buffer each version (the engine computes with
      it; no version loads while a batch is made); the other tensors are the base's own (no copy)
   generate, generate_many, max_context: the engine's
```

Invariant: after loading a version the engine computes with exactly `merge_adapters(base, adapters,
scale)`; zero B leaves the base's weights bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from cadence.model.engine import Completion, GroupEnded, StoppedGroups
from cadence.model.lora import LoraSpec, merge_adapters
from cadence.model.lora_files import read_adapter_bytes
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.transformer import hf_state_dict


class LoraRolloutEngine:
    """`engine`: the built-in engine holding the base (as built from `model.checkpoint` or the init
    seed); `base`: that base's identity, which a version's header must name."""

    def __init__(self, engine: TorchRolloutEngine, spec: LoraSpec, base: str) -> None:
        self.inner = engine
        self.spec = spec
        self.base = base
        # the engine's own tensors, in its dtype and device: never written (each load assigns new ones)
        self.base_state = {k: t.detach() for k, t in hf_state_dict(engine.engine.model).items()}
        self._merged: dict[str, Tensor] = {}  # each target's merged weight, written again each version

    def load(self, weights: bytes | bytearray) -> None:
        adapters, scale, base = read_adapter_bytes(weights)
        if base != self.base:
            raise ValueError(
                f"a version of adapters trained on base {base}, while this engine holds base {self.base}:"
                " the trainer and the workers must load the same model.checkpoint"
            )
        self._merge(adapters, scale)

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self._merge(state, self.spec.scale)

    def _merge(self, adapters: Mapping[str, Tensor], scale: float) -> None:
        merged = merge_adapters(self.base_state, adapters, scale, self._merged)
        self.inner.engine.load_state_dict(merged, share=True)  # every tensor the engine's dtype and device

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.inner.generate(prompt, seeds)

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        return self.inner.generate_many(groups, temperature, max_new_tokens, ended=ended, stopped=stopped)
