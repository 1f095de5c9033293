"""Heap settings for a process that receives large messages again and again (a rollout worker).

ZeroMQ allocates every received frame of a weight chunk (megabytes) afresh, and glibc by default hands
such blocks back to the kernel when they are freed, so each version's chunks fault in new pages: on a
loaded machine that costs as much CPU as the checksum. `keep_freed_memory` makes glibc serve blocks up
to `mmap_threshold` from the heap and keep up to `trim_bytes` of freed heap for the next ones.

Invariant: it changes only glibc's allocation thresholds of this process, and only where glibc's
`mallopt` exists; elsewhere it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3


def keep_freed_memory(
    trim_bytes: int = 256 << 20, top_pad: int = 64 << 20, mmap_threshold: int = 32 << 20
) -> bool:
    """True when glibc took the settings."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((M_TRIM_THRESHOLD, trim_bytes), (M_TOP_PAD, top_pad), (M_MMAP_THRESHOLD, mmap_threshold))
    return all(mallopt(param, value) == 1 for param, value in settings)
