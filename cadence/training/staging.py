"""The next version's buffer made while the trainer waits: its parameters moved into it, the step taken there.

```
 after publishing k (off the critical path: the workers generate k's first tokens meanwhile)
   stage(model, alloc, dtype) ─► alloc(n) (a slot of shared memory, a pool's buffer) ─► version k's
      bytes written into it once (the safetensors layout `weights()` writes) ─► each parameter's
      data becomes its view there (hf_state.share_hf_state_dict; the old storage let go)
 the period's micro-batches read the parameters there; the step writes them there, in place
 weights(dtype) after the step ─► take(): that buffer itself, version k+1, nothing copied
 the parameters still in a buffer handed out ─► a step or a load first moves them into one of their
   own (make_own): a handed buffer (offered to the workers, mapped by them) never changes
```

Invariant: the parameters' data is written (step, load) only while it lives in a buffer not handed
out; a buffer handed out holds exactly what `weights()` would have written, header included.
Nothing is staged where the bytes would not be the parameters as they are: another publish dtype, a
tensor off the CPU or strided, names that are not exactly the parameters'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cadence.model.checkpoint import state_dict_from_bytes, tensors_layout, write_safetensors
from cadence.model.hf_state import hf_state_dict, share_hf_state_dict
from cadence.model.transformer import Transformer
from cadence.wire.buffer import Buffer


@dataclass
class _Stage:
    buffer: Buffer
    dtype: str | None
    handed: bool = False


def stage_problem(model: Transformer, dtype: str | None) -> str | None:
    """Why `model`'s weights cannot be its version's bytes as they are (None: they can)."""
    kind = getattr(torch, dtype) if dtype is not None else None
    state = hf_state_dict(model)
    for name, tensor in state.items():
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return f"{name} is not a contiguous tensor on the CPU"
        if kind is not None and tensor.is_floating_point() and tensor.dtype != kind:
            return f"{name} is {tensor.dtype}, versions are published in {kind}"
    if set(state) != {name for name, _ in model.named_parameters()}:
        return "the state's tensors are not exactly the parameters"
    return None


class VersionStage:
    """A learner's staged version: where its parameters live, and whether that buffer is handed out."""

    def __init__(self) -> None:
        self._stage: _Stage | None = None
        self.moves = 0  # copies made to keep a handed buffer unchanged (a step with nothing staged)

    def stage(self, model: Transformer, alloc: Callable[[int], Buffer], dtype: str | None) -> None:
        """Move the parameters into a new buffer from `alloc`, laid out as the version `weights(dtype)`
        writes (call `stage_problem` first)."""
        with torch.no_grad():
            buffer = write_safetensors(tensors_layout(hf_state_dict(model), dtype), alloc)
            share_hf_state_dict(model, state_dict_from_bytes(buffer))
        self._stage = _Stage(buffer, dtype)

    def take(self, dtype: str | None) -> Buffer | None:
        """The staged buffer as the version (the parameters as they are now), handed out from here on;
        None when nothing is staged for `dtype` or it was handed out already."""
        stage = self._stage
        if stage is None or stage.handed or stage.dtype != dtype:
            return None
        stage.handed = True
        return stage.buffer

    def make_own(self, model: Transformer) -> None:
        """Before the parameters are written: out of a handed buffer into one of their own (a copy)."""
        stage = self._stage
        if stage is None or not stage.handed:
            return
        self.moves += 1
        self.stage(model, bytearray, stage.dtype)

    def forget(self, model: Transformer) -> None:
        """Nothing staged any more, the parameters in memory of their own (before a load replaces them)."""
        self.make_own(model)
        self._stage = None
