"""A step-mode engine's adapters in one flat buffer laid out as a version's body, so that every later
version of that layout loads in one copy: no header parsed, no tensor of the 420 (SmolLM2, every
projection) looked at one by one.

```
 first version:  parsed and copied adapter by adapter (lora_engine.py), then FlatAdapters.lay_out:
                 the model's adapter parameters re-pointed into one buffer, the version's header kept
 next versions:  header byte for byte the kept one ─► body copied into the buffer, one copy
                 any other header (another base, rank, alpha, dtype, shape) ─► parsed as the first
```

Invariant: the model's adapter parameters are views of ``flat`` at the offsets, dtypes and shapes of
the header they were laid out by; a version is copied as bytes only when its header is that header
byte for byte (the same names, shapes, dtypes, offsets and metadata, the base's identity, rank and
alpha among them), so each adapter receives exactly the values parsing the version would give it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cadence.model.checkpoint import DTYPE_OF_CODE, safetensors_header
from cadence.wire.buffer import Buffer


class FlatAdapters:
    """``head``: the safetensors head (length and header) of the versions that load in one copy;
    ``flat``: the bytes every adapter parameter of the model views."""

    def __init__(self, head: bytes, flat: Tensor) -> None:
        self.head = head
        self.flat = flat

    @staticmethod
    def lay_out(model: nn.Module, data: Buffer | bytes) -> FlatAdapters | None:
        """Re-point ``model``'s adapter parameters into one buffer laid out as the version ``data``'s
        body, each keeping its values; None (nothing changed) when the version's tensors are not
        exactly the model's adapters in their shapes and dtypes."""
        own = {name: p for name, p in model.named_parameters() if ".lora_" in name}
        head, header = safetensors_header(data)
        header.pop("__metadata__", None)
        if set(header) != set(own) or not own:
            return None
        entries = []
        for name, entry in header.items():
            param, dtype = own[name], DTYPE_OF_CODE.get(entry["dtype"])
            if dtype != param.dtype or list(entry["shape"]) != list(param.shape):
                return None
            entries.append((param, dtype, *entry["data_offsets"]))
        body, at = len(data) - head, 0
        for *_, start, end in sorted(entries, key=lambda e: e[2]):  # the tensors tile the body
            if start != at or end < start:
                return None
            at = end
        if at != body:
            return None
        flat = torch.empty(body, dtype=torch.uint8, device=next(iter(own.values())).device)
        try:  # every view made before any parameter is touched
            views = [
                (param, flat[start:end].view(dtype).view(param.shape)) for param, dtype, start, end in entries
            ]
        except RuntimeError:  # an offset its dtype cannot start at
            return None
        with torch.no_grad():
            for param, view in views:
                view.copy_(param)
                param.data = view
        return FlatAdapters(bytes(data[:head]), flat)

    def load(self, data: Buffer | bytes) -> bool:
        """Copy ``data``'s body into the adapters when its head is the kept one: True; else False,
        nothing written (a read-only ``bytes`` too: parsed instead)."""
        head = self.head
        if isinstance(data, bytes) or len(data) != len(head) + self.flat.numel() or data[: len(head)] != head:
            return False
        body = torch.frombuffer(data, dtype=torch.uint8, offset=len(head), count=self.flat.numel())
        with torch.no_grad():
            self.flat.copy_(body)
        return True
