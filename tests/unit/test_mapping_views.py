"""The tensors viewing a kept mapping: made once a layout, exactly the bytes' tensors, dropped with it."""

from __future__ import annotations

import mmap

import torch

from cadence.model.checkpoint import state_dict_from_bytes, tensors_layout, write_safetensors
from cadence.model.mapping_views import MappingViews, safetensors_head


def _mapping(tensors: dict[str, torch.Tensor]) -> mmap.mmap:
    image = write_safetensors(tensors_layout(tensors, None), bytearray)
    data = mmap.mmap(-1, len(image))
    data[:] = image
    return data


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_a_mapping_of_the_same_layout_is_viewed_by_the_same_tensors_which_read_its_bytes_now() -> None:
    data = _mapping({"a": torch.arange(6.0).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)})
    views = MappingViews()
    first = views.views(data)
    assert _equal(first, state_dict_from_bytes(data))
    data[:] = _mapping({"a": torch.full((2, 3), 7.0), "b": torch.zeros(4, dtype=torch.bfloat16)})[:]
    again = views.views(data)
    assert again is first  # not made again
    assert torch.equal(again["a"], torch.full((2, 3), 7.0)) and not again["b"].any()


def test_another_layout_in_the_same_mapping_is_viewed_afresh() -> None:
    data = _mapping({"a": torch.zeros(2, 3)})
    views = MappingViews()
    first = views.views(data)
    data[:] = _mapping({"c": torch.zeros(3, 2)})[:]  # as many bytes, another header
    second = views.views(data)
    assert second is not first and list(second) == ["c"] and second["c"].shape == (3, 2)


def test_the_views_of_a_mapping_let_go_are_dropped() -> None:
    kept, gone = _mapping({"a": torch.zeros(4)}), _mapping({"a": torch.ones(4)})
    views = MappingViews()
    views.views(kept), views.views(gone)
    assert len(views) == 2
    views.keep_only(lambda data: data is kept)
    assert len(views) == 1
    gone.close()  # nothing of this process views it any more: it closes
    assert gone.closed


def test_the_head_of_bytes_too_short_or_overrunning_is_what_there_is() -> None:
    assert safetensors_head(_short(b"\x01\x02")) == b"\x01\x02"
    overrun = _short((1000).to_bytes(8, "little") + b"{}")
    assert safetensors_head(overrun) == bytes(overrun)


def _short(raw: bytes) -> mmap.mmap:
    data = mmap.mmap(-1, len(raw))
    data[:] = raw
    return data
