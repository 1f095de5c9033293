"""Versions in a GPU's memory: the device digest is a function of the bytes alone and sees any change,
a version's image on a device is the bytes it would be on the host, a held buffer is never written
again, a torn or stale one is refused. The slot protocol runs here on CPU tensors with the IPC edge
faked (an in-process registry of buffers); the CUDA IPC itself runs between two processes where
torch sees a GPU (`scripts/gpu_check.sh`)."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import struct

import pytest
import torch
import xxhash

from cadence.model.checkpoint import state_dict_from_bytes, tensors_layout, write_safetensors
from cadence.model.device_image import copy_to_host, image_nbytes, image_views, write_image
from cadence.transport import device_memory
from cadence.transport.device_memory import (
    MAX_SLOTS,
    DeviceReader,
    DeviceVersions,
    Exported,
    device_digest,
)
from cadence.transport.shared_memory import SharedError, SharingImpossible, sharing_problem
from cadence.wire.codec import decode, encode
from cadence.wire.messages import DeviceSlot, WeightMeta

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]

CPU = torch.device("cpu")


def reference_digest(data: bytes) -> str:
    """The documented formula in plain Python integers, word by word."""
    mask = (1 << 64) - 1
    padded = data + b"\0" * (-len(data) % 8)
    plain = weighted = 0
    for i in range(len(padded) // 8):
        x = (struct.unpack_from("<Q", padded, 8 * i)[0] + i * 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        x ^= x >> 31
        plain = (plain + x) & mask
        weighted = (weighted + x * (2 * i + 1)) & mask
    return xxhash.xxh3_128_hexdigest(struct.pack("<QQQ", plain, weighted, len(data)))


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1001])
def test_the_device_digest_is_the_formula_it_documents(n: int) -> None:
    data = bytes((i * 131 + 7) % 256 for i in range(n))
    assert device_digest(as_tensor(data)) == reference_digest(data)


def test_the_device_digest_sees_every_change_and_not_how_it_is_chunked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (4099,), dtype=torch.uint8, generator=g)
    whole = device_digest(data)
    monkeypatch.setattr(device_memory, "DIGEST_WORDS", 5)  # many chunks: the same digest
    assert device_digest(data) == whole
    for at in [0, 1, 8, 2047, 4095, 4098]:  # any byte, the padded tail's included
        changed = data.clone()
        changed[at] ^= 1
        assert device_digest(changed) != whole
    swapped = data.clone()
    swapped[:8], swapped[8:16] = data[8:16].clone(), data[:8].clone()
    assert device_digest(swapped) != whole  # the words' order counts
    assert device_digest(torch.zeros(16, dtype=torch.uint8)) != device_digest(
        torch.zeros(17, dtype=torch.uint8)
    )


def test_an_image_written_on_a_device_is_the_version_bytes_and_reads_back_alike() -> None:
    state = {
        "a.weight": torch.randn(3, 5),
        "b.flag": torch.tensor([True, False, True]),  # 3 bytes: the tensors after it lie unaligned
        "c.bias": torch.randn(7),
        "d.ids": torch.arange(5, dtype=torch.int64),
    }
    for dtype in (None, "bfloat16"):
        layout = tensors_layout(state, dtype)
        host = write_safetensors(layout)
        image = write_image(layout, torch.empty(image_nbytes(layout), dtype=torch.uint8))
        assert bytes(bytearray(image.tolist())) == bytes(host)
        views, expected = image_views(image), state_dict_from_bytes(bytes(host))
        assert set(views) == set(expected)
        for name, tensor in expected.items():
            assert views[name].dtype == tensor.dtype and torch.equal(views[name], tensor), name


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_an_image_copied_to_the_host_is_the_version_bytes(device: str) -> None:
    """A version's host bytes copied from its image on the device: `write_safetensors`'s bytes, in a
    slot-like mapping; a buffer of another size refused."""
    layout = tensors_layout({"a.weight": torch.randn(3, 5), "b.flag": torch.tensor([True])}, "bfloat16")
    image = write_image(layout, torch.empty(image_nbytes(layout), dtype=torch.uint8, device=device))
    host = mmap.mmap(-1, image_nbytes(layout))
    copy_to_host(image, host)
    assert bytes(host) == bytes(write_safetensors(layout))
    with pytest.raises(ValueError, match="does not fit"):
        copy_to_host(image, bytearray(image_nbytes(layout) + 1))


def test_a_malformed_image_is_refused() -> None:
    with pytest.raises(ValueError, match="no readable head"):
        image_views(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="no readable head"):
        image_views(as_tensor(struct.pack("<Q", 100) + b"{}"))
    with pytest.raises(ValueError, match="does not fit"):
        write_image(tensors_layout({"x": torch.zeros(2)}), torch.empty(3, dtype=torch.uint8))


class Registry:
    """The IPC edge, faked in process: a handle names a buffer this registry keeps."""

    def __init__(self) -> None:
        self.buffers: dict[bytes, torch.Tensor] = {}
        self.opened = 0

    def export(self, buffer: torch.Tensor) -> Exported:
        handle = len(self.buffers).to_bytes(8, "little")
        self.buffers[handle] = buffer
        return Exported(handle, buffer.numel(), 0, b"ref", 0, b"", False)

    def open(self, slot: DeviceSlot, device: torch.device) -> torch.Tensor:
        self.opened += 1
        return self.buffers[slot.handle]


def filled(nbytes: int, version: int) -> torch.Tensor:
    return torch.full((nbytes,), version % 256, dtype=torch.uint8)


def publish(versions: DeviceVersions, version: int, nbytes: int = 4096) -> DeviceSlot:
    buffer = versions.take(nbytes)
    assert buffer is not None
    buffer.copy_(filled(nbytes, version))
    return versions.write(version, buffer)


def meta(version: int, slot: DeviceSlot | None) -> WeightMeta:
    return WeightMeta(version, True, 0, "", 1 << 20, 1, device=slot)


def pair(registry: Registry) -> tuple[DeviceVersions, DeviceReader]:
    return (
        DeviceVersions(CPU, host="h", uuid="GPU-1", export=registry.export),
        DeviceReader(CPU, host="h", uuid="GPU-1", open_buffer=registry.open),
    )


def test_a_version_opened_is_the_one_written_and_its_slot_crosses_the_wire() -> None:
    registry = Registry()
    versions, reader = pair(registry)
    try:
        slot = publish(versions, 1)
        assert decode(encode(meta(1, slot), "p")).message == meta(1, slot)
        assert versions.offer(1) == slot and versions.offer(2) is None
        held = reader.open(meta(1, slot))
        assert torch.equal(held.data, filled(4096, 1))
        assert versions.held(1)
        held.release()
        assert not versions.held(1)
        reader.open(meta(1, slot)).release()
        assert registry.opened == 1  # a slot's buffer is opened once and kept
    finally:
        versions.close()


def test_a_held_buffer_is_never_written_again_and_is_reused_once_let_go() -> None:
    registry = Registry()
    versions, reader = pair(registry)
    try:
        first = publish(versions, 1)
        one = reader.open(meta(1, first))
        second = publish(versions, 2)
        two = reader.open(meta(2, second))
        third = publish(versions, 3)
        assert len({first.lock.name, second.lock.name, third.lock.name}) == 3
        assert versions.take(4096) is None  # 1 and 2 held, 3 the newest, no more buffers made
        assert len(registry.buffers) == MAX_SLOTS
        assert torch.equal(one.data, filled(4096, 1)) and torch.equal(two.data, filled(4096, 2))
        one.release()
        fourth = publish(versions, 4)
        assert fourth.lock.name == first.lock.name and versions.reused == 1
        assert torch.equal(two.data, filled(4096, 2))
        two.release()
        assert len(registry.buffers) == MAX_SLOTS
    finally:
        versions.close()


def test_buffers_of_another_size_make_room_when_none_is_held() -> None:
    """A version of another size (another dtype, a resumed run) lets free buffers of the old size go
    rather than exceed MAX_SLOTS; one a worker holds stays."""
    registry = Registry()
    versions, reader = pair(registry)
    try:
        first = publish(versions, 1)
        held = reader.open(meta(1, first))
        for version in (2, 3):
            publish(versions, version)
        bigger = [publish(versions, version, nbytes=8192) for version in (4, 5)]
        names = {first.lock.name, *(b.lock.name for b in bigger)}
        assert len(names) == 3 and versions.offer(5) == bigger[-1]  # 1 held; 2 and 3's buffers let go
        assert torch.equal(held.data, filled(4096, 1))
        held.release()
    finally:
        versions.close()


def test_a_torn_stale_or_busy_buffer_is_refused() -> None:
    registry = Registry()
    versions, reader = pair(registry)
    try:
        slot = publish(versions, 1)
        registry.buffers[slot.handle][100] ^= 0xFF  # torn
        with pytest.raises(SharedError, match="checksum"):
            reader.open(meta(1, slot))
        registry.buffers[slot.handle][100] ^= 0xFF
        second = publish(versions, 2)
        third = publish(versions, 3)  # writes 1's buffer again: its offer is stale
        assert third.lock.name == slot.lock.name
        with pytest.raises(SharedError, match="checksum"):
            reader.open(meta(1, slot))
        taken = versions.take(4096)  # 2's buffer, being written: its lock is the publisher's
        assert taken is registry.buffers[second.handle]
        with pytest.raises(SharedError, match="being written"):
            reader.open(meta(2, second))
    finally:
        versions.close()


def test_a_worker_on_another_host_or_device_cannot_share_and_a_gone_slot_is_refused() -> None:
    registry = Registry()
    versions, _ = pair(registry)
    try:
        slot = publish(versions, 1)
        other_host = DeviceReader(CPU, host="elsewhere", uuid="GPU-1", open_buffer=registry.open)
        other_device = DeviceReader(CPU, host="h", uuid="GPU-2", open_buffer=registry.open)
        with pytest.raises(SharingImpossible, match="another host"):
            other_host.open(meta(1, slot))
        with pytest.raises(SharingImpossible, match="another device"):
            other_device.open(meta(1, slot))
    finally:
        versions.close()
    with pytest.raises(SharedError, match="gone|not the slot"):
        DeviceReader(CPU, host="h", uuid="GPU-1", open_buffer=registry.open).open(meta(1, slot))


def _open_in_child(encoded: bytes, expected: bytes, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        received = decode(encoded).message
        assert isinstance(received, WeightMeta)
        slot = received.device
        reader = DeviceReader(torch.device("cuda", torch.cuda.current_device()))
        held = reader.open(meta(1, slot))
        views = image_views(held.data)
        out.put(("ok", bytes(bytearray(held.data.cpu().tolist())) == expected, sorted(views)))
        held.release()
    except Exception as err:  # reported to the parent, which fails
        out.put(("error", repr(err), []))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_a_version_crosses_to_another_process_through_cuda_ipc() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    versions = DeviceVersions(device)
    state = {"w": torch.randn(64, 32, device=device), "b": torch.randn(32, device=device)}
    layout = tensors_layout(state)
    try:
        buffer = versions.take(image_nbytes(layout))
        assert buffer is not None
        slot = versions.write(1, write_image(layout, buffer))
        expected = bytes(write_safetensors(tensors_layout({k: v.cpu() for k, v in state.items()})))
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_open_in_child, args=(encode(meta(1, slot), "p"), expected, out))
        child.start()
        status, same, names = out.get(timeout=90)
        child.join(30)
        assert (status, same, names) == ("ok", True, ["b", "w"])
        assert not versions.held(1)
    finally:
        versions.close()
