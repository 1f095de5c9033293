"""What a version's bytes are written into: a pool's `bytearray` (`transport/buffers.py`) or a slot of
shared memory (`transport/shared_memory.py`), both writable, both viewed by tensors and frames."""

from __future__ import annotations

import mmap
from typing import TypeAlias

Buffer: TypeAlias = bytearray | mmap.mmap
"""Writable bytes a version is serialised into: a pool's bytearray, or a slot of shared memory."""
