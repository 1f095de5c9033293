"""The tensors viewing each mapping a worker keeps of a publisher's slots, made once a layout.

```
 views(data) ─► the same mapping as before, the same head (8-byte size + JSON header)? ─► its tensors
                (they view the mapping: they read whatever version the slot holds now)
             ─► else state_dict_from_bytes(data) ─► kept for that mapping
 keep_only(alive) ─► the tensors of every mapping not `alive` dropped (its memory then goes with
                     the last view of it)
```

A slot holds a version of the same layout period after period; building its 272 views again (SmolLM2)
parsed the header and made every tensor anew on the critical path of every load (3-10 ms in a run).

Invariant: the tensors handed out for a mapping are exactly `state_dict_from_bytes(data)` of its
bytes as they are now: the head is compared whole before kept tensors are handed out.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from cadence.model.safetensors_bytes import state_dict_from_bytes


@dataclass
class _Views:
    data: mmap.mmap
    head: bytes
    state: dict[str, Tensor]


def safetensors_head(data: mmap.mmap) -> bytes:
    """The bytes before a safetensors body: the 8-byte size and the JSON header (as many as there are,
    when the size overruns the data: `state_dict_from_bytes` then says what is wrong)."""
    if len(data) < 8:
        return bytes(data)
    (size,) = struct.unpack("<Q", data[:8])
    return bytes(data[: 8 + min(size, len(data) - 8)])


class MappingViews:
    """Per kept mapping, its tensors and the head they were made from."""

    def __init__(self) -> None:
        self._views: dict[int, _Views] = {}  # by the mapping's id, checked to be the very object

    def views(self, data: mmap.mmap) -> dict[str, Tensor]:
        """The tensors of the safetensors bytes `data` maps (ValueError on a malformed layout)."""
        head = safetensors_head(data)
        kept = self._views.get(id(data))
        if kept is not None and kept.data is data and kept.head == head:
            return kept.state
        state = state_dict_from_bytes(data)
        self._views[id(data)] = _Views(data, head, state)
        return state

    def keep_only(self, alive: Callable[[mmap.mmap], bool]) -> None:
        """Drop the tensors of every mapping `alive` no longer names (one the reader let go)."""
        for key, kept in list(self._views.items()):
            if kept.data.closed or not alive(kept.data):
                del self._views[key]

    def __len__(self) -> int:
        return len(self._views)
