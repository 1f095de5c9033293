"""A version's safetensors bytes in a device's memory: what a publisher offers the workers on its own
GPU (transport/device_memory.py), written from the learner's tensors where they are and read back as
views there, never through host memory.

```
 write_image(layout, buffer) ─► the head (8-byte length, JSON header) copied in from the host ─► each
    tensor copied in at its offset, cast to the dtype the layout writes it in (`fill_body`, on the device)
 image_views(buffer) ─► the head read back (two small copies to the host) ─► each tensor a view of the
    buffer where its offset suits its dtype, else a copy of its bytes
 copy_to_host(image, host) ─► the whole image in one copy into a host buffer (a version's host bytes,
    once the workers on the device have it), from a GPU on a stream of its own
```

Invariant: the image's bytes are the ones `write_safetensors(layout)` writes on the host, and
`image_views` gives the tensors `state_dict_from_bytes` gives of them.
"""

from __future__ import annotations

import math
import struct

import torch
from torch import Tensor

from cadence.model.safetensors_bytes import (
    Layout,
    fill_body,
    safetensors_entries,
    safetensors_header,
)
from cadence.wire.buffer import Buffer


def image_nbytes(layout: Layout) -> int:
    """The bytes of `layout`'s image, head included."""
    return len(layout.head) + layout.nbytes


def write_image(layout: Layout, buffer: Tensor) -> Tensor:
    """`layout`'s bytes, of its tensors as they are now, written into `buffer` (uint8, one dimension,
    of `image_nbytes(layout)`, on any device)."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() != image_nbytes(layout):
        raise ValueError(
            f"an image of {image_nbytes(layout)} bytes does not fit a buffer of {tuple(buffer.shape)}"
        )
    base = len(layout.head)
    head = torch.frombuffer(bytearray(layout.head), dtype=torch.uint8)
    buffer[:base].copy_(head)
    fill_body(layout, buffer[base:], base)
    return buffer


def image_views(buffer: Tensor) -> dict[str, Tensor]:
    """The tensors of the safetensors image in `buffer` (uint8, on any device): views of it where a
    tensor's place in its storage is a multiple of its dtype's size, else copies; ValueError when
    malformed."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"an image is one row of bytes, not {buffer.dtype} of {tuple(buffer.shape)}")
    size = struct.unpack("<Q", _host_bytes(buffer[:8]))[0] if buffer.numel() >= 8 else 0
    if buffer.numel() < 8 or size > buffer.numel() - 8:
        raise ValueError(f"an image of {buffer.numel()} bytes has no readable head")
    base, header = safetensors_header(_host_bytes(buffer[: 8 + size]))
    state: dict[str, Tensor] = {}
    for name, dtype, shape, start in safetensors_entries(header, buffer.numel() - base):
        part = buffer[base + start : base + start + math.prod(shape) * dtype.itemsize]
        if part.storage_offset() % dtype.itemsize == 0:
            state[name] = part.view(dtype).view(shape)
        else:  # a view of another dtype must start at a multiple of its size
            state[name] = part.clone().view(dtype).view(shape)
    return state


def _host_bytes(part: Tensor) -> bytes:
    out = bytearray(part.numel())
    if out:
        torch.frombuffer(out, dtype=torch.uint8).copy_(part)
    return bytes(out)


def copy_to_host(image: Tensor, host: Buffer) -> None:
    """`image` (uint8, one dimension) copied into `host`, a writable buffer of as many bytes. From a GPU
    the copy goes on a stream of its own, so the kernels queued meanwhile on the default one (the
    trainer's next) do not wait behind it; it returns once the bytes are in."""
    target = torch.frombuffer(host, dtype=torch.uint8)  # type: ignore[call-overload]
    if target.numel() != image.numel():
        raise ValueError(f"an image of {image.numel()} bytes does not fit a buffer of {target.numel()}")
    if image.device.type != "cuda":
        target.copy_(image)
        return
    with torch.cuda.stream(torch.cuda.Stream(image.device)):
        target.copy_(image)
