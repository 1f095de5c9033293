"""Low-rank adapters on the transformer's projections: y = W x + b + (alpha / r) B A dropout(x).

```
 apply_lora(model, spec, seed) ─► each target nn.Linear becomes a LoraLinear holding the same W (and b),
                                  A [r, in] (PEFT's Kaiming-uniform draw) and B [out, r] (zeros);
                                  every other parameter frozen
 adapter_tensors(model)        ─► {"model.layers.0.self_attn.q_proj.lora_A.weight": A, …} (live)
 merge_adapters(base, adapters, scale) ─► base's tensors, each target's W replaced by W + scale B A
```

Invariant: a LoraLinear keeps its base's parameter names (`q_proj.weight`), so the base's state dict
moves in and out unchanged, and an adapter's name is PEFT's key without its `base_model.model.` prefix;
with B zero the adapted model computes exactly what the base does, and its forward equals the merged
model's (`merge_adapters`) to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cadence.model.hf_state import hf_state_dict
from cadence.model.invariance import linear_rows
from cadence.model.transformer import Linear, Transformer

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_PARTS = (".lora_A.weight", ".lora_B.weight")


@dataclass(frozen=True)
class LoraSpec:
    """The adapters' shape: rank r, alpha (the scale is alpha / r), dropout, the projections they sit on."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"a LoRA rank must be at least 1, got {self.rank}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets must be among {list(TARGETS)}, got {list(self.targets)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoraLinear(Linear):
    """An `nn.Linear` (its own `weight` and `bias`, frozen) plus `lora_A` and `lora_B`."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, dropout: float, generator: torch.Generator):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        device = base.weight.device
        self.lora_A = Linear(base.in_features, rank, bias=False, device=device, dtype=torch.float32)
        self.lora_B = Linear(rank, base.out_features, bias=False, device=device, dtype=torch.float32)
        with torch.no_grad():
            bound = 1.0 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)), as PEFT draws A
            draw = torch.empty(rank, base.in_features).uniform_(-bound, bound, generator=generator)
            self.lora_A.weight.copy_(draw)
            self.lora_B.weight.zero_()
        self.scale = scale
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = linear_rows(x, self.weight, self.bias, self.least)
        return out + self.lora_B(self.lora_A(self.dropout(x))) * self.scale


def target_names(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The dotted names of `model`'s linear modules whose last part is one of `targets`, in order."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets and name != "lm_head"
    ]


def apply_lora(model: Transformer, spec: LoraSpec, seed: int) -> list[str]:
    """Freeze every parameter of `model` and give each target projection adapters (A drawn from
    `seed`, the same on every rank and every run of it; B zeros); the adapted modules' names."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = target_names(model, spec.targets)
    if not names:
        raise ValueError(f"the model has none of the LoRA targets {list(spec.targets)}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = parent.get_submodule(child)
        assert isinstance(base, nn.Linear)
        setattr(parent, child, LoraLinear(base, spec.rank, spec.scale, spec.dropout, generator))
    return names


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' weights by name (`…q_proj.lora_A.weight`), live."""
    return {name: p for name, p in model.named_parameters() if name.endswith(ADAPTER_PARTS)}


def base_tensors(model: Transformer) -> dict[str, Tensor]:
    """The HF-named state of the model without its adapters: the frozen base."""
    return {k: v for k, v in hf_state_dict(model).items() if not k.endswith(ADAPTER_PARTS)}


def adapter_pairs(adapters: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """(A, B) of each adapted module, by its weight's name (`…q_proj.weight`); ValueError when an A
    has no B or the other way round, or a name is no adapter's."""
    modules: dict[str, None] = {}
    for name in adapters:
        if not name.endswith(ADAPTER_PARTS):
            raise ValueError(f"{name!r} is not an adapter's weight (…lora_A.weight or …lora_B.weight)")
        modules.setdefault(name[: -len(".lora_A.weight")], None)
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    for module in modules:
        a, b = adapters.get(f"{module}.lora_A.weight"), adapters.get(f"{module}.lora_B.weight")
        if a is None or b is None:
            raise ValueError(f"the adapter of {module} lacks its {'lora_A' if a is None else 'lora_B'}")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"the adapter of {module}: A {tuple(a.shape)} and B {tuple(b.shape)} do not pair"
            )
        pairs[f"{module}.weight"] = (a, b)
    return pairs


def merged_weight(weight: Tensor, a: Tensor, b: Tensor, scale: float, out: Tensor | None = None) -> Tensor:
    """W + scale B A, computed in float32 and returned in W's dtype and device; into `out` (W's shape,
    dtype and device) where given: a buffer written again each version costs no page faults, while a
    fresh one (a 135M model's 400 MB) costs several times the arithmetic."""
    if weight.shape != (b.shape[0], a.shape[1]):
        raise ValueError(
            f"an adapter B {tuple(b.shape)} A {tuple(a.shape)} does not fit W {tuple(weight.shape)}"
        )
    b, a = b.to(weight.device, torch.float32), a.to(weight.device, torch.float32)
    if weight.dtype == torch.float32:
        if out is None:
            return torch.addmm(weight, b, a, alpha=scale)
        return torch.addmm(weight, b, a, alpha=scale, out=out)
    merged = torch.addmm(weight.float(), b, a, alpha=scale).to(weight.dtype)
    return merged if out is None else out.copy_(merged)


def merge_adapters(
    base: Mapping[str, Tensor],
    adapters: Mapping[str, Tensor],
    scale: float,
    buffers: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """`base`'s tensors (HF-named, shared, not copied), each adapted weight replaced by its merged one;
    with `buffers`, each merged weight written into its buffer there (allocated the first time)."""
    merged = dict(base)
    for name, (a, b) in adapter_pairs(adapters).items():
        if name not in base:
            raise ValueError(f"an adapter for {name}, which the base model does not have")
        out = None if buffers is None else buffers.get(name)
        if buffers is not None and out is None:
            out = buffers[name] = torch.empty_like(base[name])
        merged[name] = merged_weight(base[name], a, b, scale, out)
    return merged


def trainable_count(model: nn.Module) -> int:
    """The parameters the optimizer moves."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
