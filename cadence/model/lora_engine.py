"""The built-in engine taking adapter versions: each merged into its own copy of the base on load.

```
 LoraRolloutEngine(engine, spec, base)   holds the base's tensors as the engine first had them
   load(bytes)        adapters, scale and base identity from the version's header (lora_files.py);
                      refused when trained on another base
   load_state(tensors) adapters received by broadcast, at the spec's scale
   ─► each target W = base W + scale B A (float32, then the engine's dtype), recomputed from the base
      every version, never accumulated, into the same buffer each version (the engine computes with
      it; no version loads while a batch is made); the other tensors are the base's own (no copy)
   generate, generate_many (joining groups and a limit a group too), max_context: the engine's
```

With `apply = "step"` the engine's model carries the adapters itself (`LoraLinear`) and a load copies
the version's A and B into them: no merge, a low-rank product more a projection in every step. After
the first version its adapters lie in one buffer laid out as a version's body (`lora_flat.py`), and a
version of the same header is copied into it in one piece.

Invariant: after loading a version the engine computes with exactly `merge_adapters(base, adapters,
scale)` (merge) or the base with those adapters (step, equal to float rounding); zero B leaves the
base's outputs bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from cadence.model.engine import Completion, GroupEnded, JoiningGroups, StoppedGroups
from cadence.model.hf_state import hf_state_dict
from cadence.model.lora import LoraSpec, adapter_pairs, apply_lora, merge_adapters
from cadence.model.lora_files import read_adapter_bytes
from cadence.model.lora_flat import FlatAdapters
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.wire.buffer import Buffer

APPLY = ("merge", "step")


class LoraRolloutEngine:
    """`engine`: the built-in engine holding the base (as built from `model.checkpoint` or the init
    seed); `base`: that base's identity, which a version's header must name."""

    def __init__(self, engine: TorchRolloutEngine, spec: LoraSpec, base: str, apply: str = "merge") -> None:
        if apply not in APPLY:
            raise ValueError(f"trainer.lora.apply must be one of {list(APPLY)}, got {apply!r}")
        self.inner = engine
        self.spec = spec
        self.base = base
        self.apply = apply
        model = engine.engine.model
        if apply == "step":  # the engine's own model computes W x + scale B A x: adapters of its dtype
            weight = model.model.embed_tokens.weight
            apply_lora(model, spec, seed=0)  # A's draw is replaced by the first version's
            model.to(device=weight.device, dtype=weight.dtype).requires_grad_(False).eval()
        # the engine's own tensors, in its dtype and device: the base's never written (a merge assigns
        # new ones, a step-mode load copies the adapters into the model's own). A compiled engine's
        # load copies a merge into the model's own tensors (its graphs read them where they are): its
        # base is then a copy of its own, else the second version would merge onto the first
        copied = engine.engine.runner.compiled and apply == "merge"
        self.base_state = {
            k: t.detach().clone() if ".lora_" in k or copied else t.detach()
            for k, t in hf_state_dict(model).items()
        }
        self._merged: dict[str, Tensor] = {}  # each target's merged weight, written again each version
        self._adapters: dict[str, Tensor] | None = None  # step mode: the model's own A and B, by name
        self._flat: FlatAdapters | None = None  # step mode: the adapters in one buffer, once laid out

    def load(self, weights: bytes | Buffer) -> None:
        """A version's bytes; in step mode, one of the layout loaded before copied in one piece
        (`lora_flat.py`: a rank-8 version of SmolLM2's 420 adapters, parsed and copied one by one,
        cost a worker's load several ms more)."""
        if self._flat is not None and self._flat.load(weights):
            self.inner.engine.weights_changed()
            return
        adapters, scale, base = read_adapter_bytes(weights)
        if base != self.base:
            raise ValueError(
                f"a version of adapters trained on base {base}, while this engine holds base {self.base}:"
                " the trainer and the workers must load the same model.checkpoint"
            )
        self._merge(adapters, scale)
        if self.apply == "step" and not self.inner.engine.runner.compiled:
            # a compiled step reads the adapters where they were: those stay, copied one by one
            flat = FlatAdapters.lay_out(self.inner.engine.model, weights)
            if flat is not None:
                self._flat, self._adapters = flat, None  # the parameters now view the flat buffer

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self._merge(state, self.spec.scale)

    def _merge(self, adapters: Mapping[str, Tensor], scale: float) -> None:
        if self.apply == "step":
            if scale != self.spec.scale:
                raise ValueError(
                    f"a version of adapters at scale {scale}, the engine's are {self.spec.scale}"
                )
            pairs = adapter_pairs(adapters)  # every A with its B
            if {f"{m.removesuffix('.weight')}.lora_A.weight" for m in pairs} != set(self._adapter_names()):
                raise ValueError("a version whose adapters are not the engine's (other targets)")
            own = self._own_adapters()
            names = list(adapters)
            with torch.no_grad():  # written in place, in one call: the base's tensors untouched
                torch._foreach_copy_([own[n] for n in names], [adapters[n] for n in names])
            self.inner.engine.weights_changed()
            return
        merged = merge_adapters(self.base_state, adapters, scale, self._merged)
        self.inner.engine.load_state_dict(merged, share=True)  # every tensor the engine's dtype and device

    def _own_adapters(self) -> dict[str, Tensor]:
        """The engine's model's own adapter tensors by name (step mode; they stay the same tensors)."""
        if self._adapters is None:
            own = hf_state_dict(self.inner.engine.model)
            self._adapters = {k: t for k, t in own.items() if ".lora_" in k}
        return self._adapters

    def _adapter_names(self) -> list[str]:
        return [k for k in self.base_state if k.endswith(".lora_A.weight")]

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.inner.generate(prompt, seeds)

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    joins = True  # the built-in engine's calls take joining groups and a limit a group, as they are
    limited = True

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
        limits: Sequence[int] | None = None,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> list[list[Completion]]:
        return self.inner.generate_many(
            groups,
            temperature,
            max_new_tokens,
            ended=ended,
            stopped=stopped,
            joining=joining,
            limits=limits,
            shared=shared,
            positions=positions,
        )
