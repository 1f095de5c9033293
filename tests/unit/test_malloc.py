"""The rollout worker's heap settings: glibc takes them, and large blocks still come and go."""

from __future__ import annotations

import platform
import sys

import pytest

from cadence.transport.malloc import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_takes_the_settings_and_large_blocks_still_work() -> None:
    assert keep_freed_memory()
    blocks = [bytearray(4 << 20) for _ in range(8)]  # the size of a weight chunk
    blocks[3][-1] = 7
    assert sum(len(b) for b in blocks) == 32 << 20 and blocks[3][-1] == 7
    del blocks
    assert bytearray(64 << 20)[-1] == 0  # above the threshold: still a clean, zeroed block
