"""The publisher's chunked weight store, and how one group is padded and masked for training."""

from __future__ import annotations

import pytest
import torch

from cadence.training.policy_pass import pad_group
from cadence.transport.weights import WeightError, WeightStore
from cadence.wire.digest import digest

DATA = bytes(range(256)) * 10 + b"tail"  # 2564 bytes


def test_meta_describes_the_chunks() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    stored = store.put(1, DATA)
    assert stored.digest == digest(DATA)
    meta = store.meta(1)
    assert (meta.version, meta.available, meta.nbytes, meta.digest) == (1, True, 2564, digest(DATA))
    assert (meta.chunk_bytes, meta.chunks) == (1000, 3)


def test_chunks_have_full_sizes_then_a_short_last_one_and_join_to_the_data() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    store.put(1, DATA)
    chunks = [store.chunk(1, i) for i in range(3)]
    assert all(c is not None for c in chunks)
    assert [len(c.data) for c in chunks if c] == [1000, 1000, 564]
    assert [(c.version, c.index) for c in chunks if c] == [(1, 0), (1, 1), (1, 2)]
    assert b"".join(c.data for c in chunks if c) == DATA


def test_chunks_are_views_of_the_stored_bytes_not_copies() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    store.put(1, DATA)
    chunk = store.chunk(1, 1)
    assert chunk is not None and isinstance(chunk.data, memoryview)
    assert chunk.data.obj is store.get(1).data  # type: ignore[union-attr]
    assert chunk.data == DATA[1000:2000]


def test_exact_multiple_has_no_empty_trailing_chunk() -> None:
    store = WeightStore(chunk_bytes=4, keep=1)
    store.put(0, b"abcdefgh")
    assert store.meta(0).chunks == 2
    assert store.chunk(0, 1) is not None and store.chunk(0, 1).data == b"efgh"  # type: ignore[union-attr]
    assert store.chunk(0, 2) is None


def test_empty_weights_are_one_empty_chunk() -> None:
    store = WeightStore(chunk_bytes=4, keep=1)
    store.put(0, b"")
    assert store.meta(0).chunks == 1
    chunk = store.chunk(0, 0)
    assert chunk is not None and chunk.data == b""
    assert store.chunk(0, 1) is None


@pytest.mark.parametrize("index", [-1, 3, 100])
def test_chunk_index_out_of_range_is_none(index: int) -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    store.put(1, DATA)
    assert store.chunk(1, index) is None


def test_unknown_version_is_unavailable() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    meta = store.meta(9)
    assert meta.available is False and meta.chunks == 0 and meta.nbytes == 0
    assert store.chunk(9, 0) is None
    assert store.latest is None


def test_old_versions_are_evicted_after_keep() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    for version in range(4):
        store.put(version, DATA + bytes([version]))
    assert store.latest == 3
    assert [store.meta(v).available for v in range(4)] == [False, False, True, True]
    assert store.chunk(1, 0) is None
    chunk = store.chunk(2, 2)
    assert chunk is not None and chunk.data == DATA[2000:] + b"\x02"


def test_put_with_the_announced_checksum_is_stored() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    assert store.put(1, DATA, digest(DATA)).digest == digest(DATA)
    stored = store.get(1)
    assert stored is not None and bytes(stored.data) == DATA


def test_put_with_a_wrong_announced_checksum_raises_and_stores_nothing() -> None:
    store = WeightStore(chunk_bytes=1000, keep=2)
    with pytest.raises(WeightError, match="version 5"):
        store.put(5, DATA, digest(DATA + b"x"))
    assert store.meta(5).available is False
    assert store.latest is None


# ---------------------------------------------------------------- pad_group


def test_pad_group_masks_exactly_the_completion_tokens() -> None:
    prompt = [10, 11, 12]
    completions = [[1, 2], [3, 4, 5, 6], [7]]
    inputs, targets, mask = pad_group(prompt, completions, pad_id=0)
    assert inputs.shape == targets.shape == mask.shape == (3, 3 + 4 - 1)
    assert mask.dtype == torch.bool
    for i, completion in enumerate(completions):
        assert targets[i][mask[i]].tolist() == completion
        assert int(mask[i].sum()) == len(completion)
    assert mask.tolist() == [
        [False, False, True, True, False, False],
        [False, False, True, True, True, True],
        [False, False, True, False, False, False],
    ]


def test_pad_group_targets_are_inputs_shifted_by_one() -> None:
    prompt = [10, 11]
    completions = [[1, 2, 3], [4]]
    inputs, targets, _ = pad_group(prompt, completions, pad_id=99)
    assert inputs.tolist() == [[10, 11, 1, 2], [10, 11, 4, 99]]
    assert targets.tolist() == [[11, 1, 2, 3], [11, 4, 99, 99]]
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_pad_group_single_token_prompt() -> None:
    inputs, targets, mask = pad_group([5], [[1, 2], [3]], pad_id=0)
    assert inputs.tolist() == [[5, 1], [5, 3]]
    assert targets.tolist() == [[1, 2], [3, 0]]
    assert mask.tolist() == [[True, True], [True, False]]
