"""Where a version lies in another process's memory on this host, as a `WeightMeta` names it: a slot of
shared host memory (`SharedSlot`, cadence.transport.shared_memory) or a buffer on a GPU
(`DeviceSlot`, cadence.transport.device_memory).

Invariant: every field is typed and ranged (counts never negative, handles of bounded length), so
the codec refuses anything else; a slot names memory, it never carries it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

Count = Annotated[int, Meta(ge=0)]
Handle = Annotated[bytes, Meta(max_length=256)]


class SharedSlot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a version lies in the publisher's memory (`cadence.transport.shared_memory`): the memfd
    open as `fd` in process `pid`, named `name`, reachable by a worker whose `host` identity (boot id,
    network and pid namespaces) is this one; `activity`: the descriptor of the trainer's activity
    page in that process (`cadence.transport.activity`), None where it has none."""

    host: str
    pid: Count
    fd: Count
    name: str
    activity: Count | None = None


class DeviceSlot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a version lies in a GPU's memory (`cadence.transport.device_memory`): `nbytes` of a
    safetensors image at the start of the CUDA allocation that `handle` opens (its IPC handle, with
    the storage's size, offset and reference counter as torch shares them), on the device of `uuid`;
    `lock`: the empty memfd a worker holds shared while it uses the buffer (as a `SharedSlot`'s);
    `digest`: the image's digest computed on the device (`device_digest`)."""

    lock: SharedSlot
    uuid: str
    handle: Handle
    storage_bytes: Count
    storage_offset: Count
    ref_handle: Handle
    ref_offset: Count
    event_handle: Handle
    event_sync: bool
    nbytes: Count
    digest: str
