"""Bucket layout of a broadcast: pure functions, bit-exact round trips."""

from __future__ import annotations

import pytest
import torch

from cadence.transport.buckets import ALIGN, fill_bucket, plan_buckets, plan_from_layout, read_bucket


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b": torch.randn(7, 3, generator=g),
        "a": torch.randn(5, generator=g).to(torch.bfloat16),
        "c": torch.arange(11, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "big": torch.randn(300, generator=g, dtype=torch.float64),
    }


@pytest.mark.parametrize("bucket_bytes", [64, 200, 1 << 20])
def test_round_trip_is_bit_exact_in_name_order_and_aligned(bucket_bytes: int) -> None:
    s = state()
    plan = plan_buckets(s, bucket_bytes)
    assert [slot.name for slot in plan.slots] == sorted(s)
    assert all(slot.offset % ALIGN == 0 for slot in plan.slots)
    for size in plan.sizes:  # a bucket over the limit holds one tensor alone
        members = [slot for slot in plan.slots if slot.offset + slot.nbytes == size]
        assert size <= bucket_bytes or len(members) == 1
    got: dict[str, torch.Tensor] = {}
    for index, size in enumerate(plan.sizes):
        buffer = torch.zeros(size, dtype=torch.uint8)
        fill_bucket(plan, s, index, buffer)
        got.update(read_bucket(plan, index, buffer.clone()))
    assert set(got) == set(s)
    for name, tensor in s.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(got[name], tensor)
    assert plan.nbytes == sum(t.numel() * t.element_size() for t in s.values())


def test_small_buckets_split_and_a_big_tensor_stands_alone() -> None:
    plan = plan_buckets(state(), 200)
    assert len(plan.sizes) > 2
    big = next(slot for slot in plan.slots if slot.name == "big")
    assert big.offset == 0 and plan.sizes[big.bucket] == 2400


def test_a_layout_from_a_message_is_checked() -> None:
    plan = plan_buckets(state(), 1 << 20)
    columns = (
        [s.name for s in plan.slots],
        [s.dtype for s in plan.slots],
        [list(s.shape) for s in plan.slots],
        [s.bucket for s in plan.slots],
        [s.offset for s in plan.slots],
        list(plan.sizes),
    )
    assert plan_from_layout(*columns) == plan
    names, dtypes, shapes, buckets, offsets, sizes = columns
    with pytest.raises(ValueError, match="does not fit"):
        plan_from_layout(names, dtypes, shapes, buckets, offsets, [sizes[0] - 1])
    with pytest.raises(ValueError, match="does not fit"):
        plan_from_layout(names, dtypes, shapes, [1] * len(buckets), offsets, sizes)
    with pytest.raises(ValueError, match="unknown dtype"):
        plan_from_layout(names, ["float99"] * len(names), shapes, buckets, offsets, sizes)
    with pytest.raises(ValueError):
        plan_from_layout(names[:-1], dtypes, shapes, buckets, offsets, sizes)
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(state(), 0)
