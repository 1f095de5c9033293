"""The trainer's activity on its host: the byte a worker reads is the one the trainer last set, from
another process too; only the page of the slot's own publisher is opened; a page that cannot be
read says busy (the worker keeps its share); the page is the run's user's alone."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
from multiprocessing.connection import Connection

import msgspec
import pytest

from cadence.transport.activity import ActivityReader
from cadence.transport.shared_memory import SharedVersions, sharing_problem
from cadence.wire.messages import SharedSlot

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sharing_problem() is not None, reason=f"this host cannot share: {sharing_problem()}"),
]


def _read(slot: SharedSlot, conn: Connection) -> None:
    reader = ActivityReader.of(slot)
    conn.send(None if reader is None else reader.busy())
    while conn.recv():  # asked again after each change
        conn.send(None if reader is None else reader.busy())


def test_a_worker_reads_what_the_trainer_last_set_from_another_process() -> None:
    shared = SharedVersions(keep=2)
    try:
        slot = shared.write(0, b"x" * 4096)
        assert slot.activity == shared.activity.fd and shared.offer(0) == slot
        mode = os.stat(f"/proc/{slot.pid}/fd/{slot.activity}").st_mode
        assert stat.S_IMODE(mode) == 0o600
        ours, theirs = mp.Pipe()
        child = mp.get_context("spawn").Process(target=_read, args=(slot, theirs))
        child.start()
        assert ours.recv() is True  # a new page: busy until a trainer says it waits
        for busy in (False, True, False):
            shared.activity.set(busy)
            ours.send(True)
            assert ours.recv() is busy
        ours.send(False)
        child.join(30)
        assert child.exitcode == 0
    finally:
        shared.close()


def test_only_the_activity_of_the_slots_own_publisher_is_opened() -> None:
    shared, other = SharedVersions(keep=2), SharedVersions(keep=2)
    try:
        slot = shared.write(0, b"x" * 4096)
        reader = ActivityReader.of(slot)
        assert reader is not None and reader.names(slot)
        assert not reader.names(other.write(0, b"y" * 4096))
        # a descriptor that is not this publisher's activity (its slot's own, the other's page)
        for fd in (slot.fd, other.activity.fd):
            assert ActivityReader.of(msgspec.structs.replace(slot, activity=fd)) is None
        assert ActivityReader.of(msgspec.structs.replace(slot, activity=None)) is None
        reader.close()
        assert reader.busy()  # a page it no longer reads: busy, the worker keeps its share
    finally:
        shared.close()
        other.close()


def test_setting_a_closed_activity_is_nothing() -> None:
    shared = SharedVersions(keep=2)
    shared.close()
    shared.activity.set(True)  # the publisher stopped sharing while the trainer computed
