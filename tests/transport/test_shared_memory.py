"""Versions in shared memory: what a worker maps is the version its digest names, a slot a worker
holds is never written again, a torn or stale slot is refused, and the slots are the run's user's."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import time
from multiprocessing.connection import Connection

import pytest

from cadence.transport.shared_memory import (
    SharedError,
    SharedReader,
    SharedVersions,
    SharingImpossible,
    sharing_problem,
)
from cadence.wire.digest import digest
from cadence.wire.messages import SharedSlot, WeightMeta

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]

NBYTES = 1 << 16


def version_bytes(version: int, nbytes: int = NBYTES) -> bytes:
    """Bytes that say which version they are everywhere: a torn mix of two is never one of them."""
    return version.to_bytes(8, "little") * (nbytes // 8)


def meta(version: int, slot: SharedSlot | None, nbytes: int = NBYTES) -> WeightMeta:
    return WeightMeta(version, True, nbytes, digest(version_bytes(version, nbytes)), 1 << 20, 1, shared=slot)


def test_a_mapped_version_is_the_published_bytes_in_a_slot_only_its_user_reads() -> None:
    shared = SharedVersions(keep=2)
    try:
        slot = shared.write(1, version_bytes(1))
        assert shared.offer(1) == slot
        mapped = SharedReader().map(meta(1, slot))
        assert bytes(mapped.data) == version_bytes(1)
        mode = os.stat(f"/proc/{slot.pid}/fd/{slot.fd}").st_mode
        assert stat.S_IMODE(mode) == 0o600
        mapped.data[0] ^= 0xFF  # a private mapping: the publisher's bytes stay
        assert SharedReader().map(meta(1, slot)).data[:8] == version_bytes(1)[:8]
        mapped.release()
    finally:
        shared.close()


def test_a_torn_slot_fails_its_checksum_and_is_refused() -> None:
    shared = SharedVersions(keep=2)
    try:
        slot = shared.write(1, version_bytes(1))
        # half of version 2 written over version 1: what a reader of an unlocked rewrite would see
        shared._slots[-1].view[: NBYTES // 2] = version_bytes(2)[: NBYTES // 2]
        with pytest.raises(SharedError, match="checksum"):
            SharedReader().map(meta(1, slot))
    finally:
        shared.close()


def test_a_stale_offer_is_refused_once_its_slot_holds_a_later_version() -> None:
    shared = SharedVersions(keep=1)
    try:
        old = shared.write(1, version_bytes(1))
        assert shared.write(2, version_bytes(2)).fd == old.fd  # nobody held it: written again
        assert shared.offer(1) is None
        with pytest.raises(SharedError, match="checksum"):
            SharedReader().map(meta(1, old))
    finally:
        shared.close()


def test_a_held_slot_is_never_written_again_and_is_reused_once_let_go() -> None:
    shared = SharedVersions(keep=1)
    try:
        first = shared.write(1, version_bytes(1))
        held = SharedReader().map(meta(1, first))
        for version in range(2, 6):
            assert shared.write(version, version_bytes(version)).fd != first.fd
        assert bytes(held.data) == version_bytes(1)  # unchanged under the worker
        held.release()
        del held  # and nothing views its mapping any more
        assert shared.write(6, version_bytes(6)).fd == first.fd  # the oldest slot, written again
    finally:
        shared.close()


def test_a_slot_being_written_is_refused() -> None:
    shared = SharedVersions(keep=2)
    try:
        slot = shared.write(1, version_bytes(1))
        import fcntl

        fcntl.flock(shared._slots[-1].fd, fcntl.LOCK_EX)  # as while the publisher writes it again
        with pytest.raises(SharedError, match="being written"):
            SharedReader().map(meta(1, slot))
    finally:
        shared.close()


def test_another_host_or_a_gone_publisher_is_no_slot_to_map() -> None:
    shared = SharedVersions(keep=2)
    try:
        slot = shared.write(1, version_bytes(1))
        with pytest.raises(SharingImpossible, match="another host"):
            SharedReader(host="another-host").map(meta(1, slot))
        with pytest.raises(SharedError):  # a descriptor that is not the slot named
            SharedReader().map(meta(1, SharedSlot(slot.host, slot.pid, 0, slot.name)))
    finally:
        shared.close()
    with pytest.raises(SharedError, match="gone"):
        SharedReader().map(meta(1, slot))


def _reader(conn: Connection, nbytes: int) -> None:
    """Map every offer the publisher sends, check the bytes are one version whole, hold them a while and
    check again; report what it loaded, refused, and any bytes that were not the offered version's."""
    reader = SharedReader()
    loaded = refused = wrong = 0
    held = None
    while True:
        offer = conn.recv()
        if offer is None:
            break
        version, slot = offer
        try:
            mapped = reader.map(meta(version, slot, nbytes))
        except SharedError:
            refused += 1
        else:
            expected = version_bytes(version, nbytes)
            wrong += bytes(mapped.data) != expected
            time.sleep(0.001)  # the publisher writes meanwhile
            wrong += bytes(mapped.data) != expected
            loaded += 1
            if held is not None:
                held.release()
            held = mapped
        conn.send((loaded, refused, wrong))
    conn.send((loaded, refused, wrong))


@pytest.mark.parametrize("keep", [1, 2])
def test_a_worker_never_loads_a_half_written_version_while_versions_are_published(keep: int) -> None:
    nbytes = 1 << 20
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_reader, args=(child, nbytes), daemon=True)
    proc.start()
    shared = SharedVersions(keep=keep)
    loaded = refused = wrong = 0
    try:
        version = 0
        deadline = time.monotonic() + 90
        while loaded < 100 and time.monotonic() < deadline:
            version += 1
            slot = shared.write(version, version_bytes(version, nbytes))
            parent.send((version, slot))
            shared.write(version + 1000, version_bytes(version + 1000, nbytes))  # written while it reads
            loaded, refused, wrong = parent.recv()
        parent.send(None)
        loaded, refused, wrong = parent.recv()
    finally:
        proc.join(30)
        shared.close()
    assert wrong == 0
    assert loaded >= 100, (loaded, refused)


def test_a_version_written_into_a_taken_slot_is_offered_without_a_copy() -> None:
    shared = SharedVersions(keep=2)
    try:
        buffer = shared.take(NBYTES)
        buffer[:] = version_bytes(1)  # as the trainer serialises into it
        slot = shared.write(1, buffer)
        assert shared._slots[-1].view is buffer and shared.offer(1) == slot
        assert bytes(SharedReader().map(meta(1, slot)).data) == version_bytes(1)
        # a taken slot never written (the serialisation failed) goes back, free, to the next take
        shared.take(NBYTES)
        again = shared.take(NBYTES)
        assert shared._made == 2 and len(shared._slots) == 1
        again[:] = version_bytes(2)
        assert shared.write(2, again).fd != slot.fd
    finally:
        shared.close()


def test_a_slot_this_process_still_views_is_not_taken_until_let_go() -> None:
    shared = SharedVersions(keep=1)
    try:
        first = shared.write(1, version_bytes(1))
        stored = shared._slots[-1].view  # a stored version, a frame under way: a reference to it
        assert shared.write(2, version_bytes(2)).fd != first.fd
        assert bytes(stored[:8]) == version_bytes(1)[:8]
        del stored
        assert shared.write(3, version_bytes(3)).fd == first.fd
    finally:
        shared.close()


def test_a_reader_keeps_a_slots_mapping_and_sees_it_written_again() -> None:
    shared = SharedVersions(keep=2)  # versions go to two slots in turn: 1, 3, 5 to one, 2, 4 to the other
    reader = SharedReader()
    try:
        slots = {v: shared.write(v, version_bytes(v)) for v in (1, 2)}
        first = reader.map(meta(1, slots[1]))
        kept = first.data
        first.release()
        reader.map(meta(2, slots[2])).release()
        assert shared.write(3, version_bytes(3)) == slots[1]  # the first slot, written again
        third = reader.map(meta(3, slots[1]))
        assert third.data is kept and bytes(third.data) == version_bytes(3)  # its mapping, kept
        third.data[0] ^= 0xFF  # a page of the worker's own: its mapping no longer shows the slot
        third.release()
        assert shared.write(4, version_bytes(4)) == slots[2]
        assert shared.write(5, version_bytes(5)) == slots[1]
        fifth = reader.map(meta(5, slots[1]))
        assert fifth.data is not kept and bytes(fifth.data) == version_bytes(5)  # mapped afresh
        fifth.release()
    finally:
        shared.close()
    with pytest.raises(SharedError, match="gone"):  # and the reader lets its mappings of them go
        reader.map(meta(5, slots[1]))
    assert reader._kept == {}
