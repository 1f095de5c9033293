"""A pool of large buffers: one given back is handed out again, unless something still views it."""

from __future__ import annotations

import safetensors.torch
import torch

from cadence.model.checkpoint import (
    state_dict_from_bytes,
    tensors_layout,
    tensors_to_bytes,
    write_safetensors,
)
from cadence.transport.buffers import BufferPool
from cadence.transport.weights import WeightStore
from cadence.wire.buffer import Buffer


def test_a_given_back_buffer_of_the_size_is_handed_out_again() -> None:
    pool = BufferPool(keep=2)
    first = pool.take(64)
    assert len(first) == 64 and pool.reused == 0
    pool.give(first)
    given = id(first)
    del first  # its owner is done with it: the pool holds the one reference
    assert id(pool.take(32)) != given  # another size: a new one
    again = pool.take(64)
    assert id(again) == given and pool.reused == 1
    assert pool.take(64) is not again  # handed out: no longer in the pool


def test_a_buffer_still_held_or_viewed_is_not_handed_out_until_let_go() -> None:
    pool = BufferPool(keep=2)
    buffer = bytearray(b"x" * 64)
    given = id(buffer)
    pool.give(buffer)
    assert id(pool.take(64)) != given  # its owner still holds it
    view = memoryview(buffer)[8:16]  # e.g. a chunk in a frame not yet sent
    tensor = torch.frombuffer(buffer, dtype=torch.uint8)[4:8]  # e.g. a loaded state dict's tensor
    del buffer
    assert id(pool.take(64)) != given
    view.release()
    assert id(pool.take(64)) != given
    del tensor
    again = pool.take(64)
    assert id(again) == given and again == b"x" * 64


def test_only_bytearrays_are_kept_and_only_the_newest_keep() -> None:
    pool = BufferPool(keep=1)
    pool.give(b"y" * 64)
    assert pool.take(64) == bytearray(64)  # bytes cannot be written: not kept
    old, new = bytearray(64), bytearray(64)
    pool.give(old)
    pool.give(new)
    pool.give(new)
    ids = id(old), id(new)
    del old, new
    assert id(pool.take(64)) == ids[1] and id(pool.take(64)) != ids[0]


def test_serialising_into_a_reused_buffer_overwrites_every_byte() -> None:
    pool = BufferPool()
    state = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4, dtype=torch.int64)}
    fresh = tensors_to_bytes(state)
    pool.give(bytearray(b"\xff" * len(fresh)))  # the bytes of a version let go
    again = tensors_to_bytes(state, pool.take)
    assert pool.reused == 1 and again == fresh
    loaded = state_dict_from_bytes(again)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_floating_point_tensors_are_written_in_the_dtype_asked_and_the_rest_as_they_are() -> None:
    state = {
        "a": torch.tensor([1.0, 1 + 2**-10, -3.5], dtype=torch.float32),  # 1 + 2^-10 rounds to 1 in bf16
        "b": torch.arange(3, dtype=torch.uint8),  # odd bytes: "c" then starts at an odd offset
        "c": torch.linspace(-2, 2, 7, dtype=torch.float64).view(7, 1),
        "d": torch.ones(2, dtype=torch.int64),
    }
    data = tensors_to_bytes(state, dtype=torch.bfloat16)
    read = safetensors.torch.load(bytes(data))  # the format's own reader
    assert {k: v.dtype for k, v in read.items()} == {
        "a": torch.bfloat16,
        "b": torch.uint8,
        "c": torch.bfloat16,
        "d": torch.int64,
    }
    for name, tensor in state.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert torch.equal(read[name], expected), name
    assert read["a"].tolist() == [1.0, 1.0, -3.5]


def test_the_store_gives_back_the_bytes_of_a_version_it_lets_go() -> None:
    evicted: list[bytes | Buffer] = []
    store = WeightStore(chunk_bytes=16, keep=2, evicted=evicted.append)
    versions = [bytearray([v]) * 40 for v in range(4)]
    for v, data in enumerate(versions):
        store.put(v, data)
    assert [e[0] for e in evicted] == [0, 1] and all(a is b for a, b in zip(evicted, versions, strict=False))
    store.put(3, versions[3])  # the same version again: nothing let go twice
    assert len(evicted) == 2


def test_a_kept_layout_writes_its_tensors_as_they_are_now_and_knows_when_one_was_replaced() -> None:
    state = {"w": torch.zeros(2, 3), "b": torch.arange(4, dtype=torch.int64)}
    layout = tensors_layout(state, metadata={"k": "v"})
    assert layout.flat is not None  # contiguous CPU tensors written as they are: one concatenation
    state["w"].add_(1.5)  # written in place, as an optimizer does
    assert bytes(write_safetensors(layout)) == bytes(tensors_to_bytes(state, metadata={"k": "v"}))
    assert layout.holds(state)
    state["w"] = torch.ones(2, 3)  # another tensor: the layout no longer views it
    assert not layout.holds(state)
    strided = {"t": torch.arange(12.0).view(3, 4).t()}
    assert tensors_layout(strided).flat is None  # a copy would not follow the tensor
    assert state_dict_from_bytes(write_safetensors(tensors_layout(strided)))["t"].equal(strided["t"])
