"""Unit tests run torch on one thread: their tensors are tiny, and idle OpenMP workers spin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    """One thread: the tensors are tiny, and idle OpenMP workers spin on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
