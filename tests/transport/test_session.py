"""The session layer on in-process channels: the test plays the dispatcher, a fake clock plays time."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import structlog

from cadence.transport.heartbeat import Liveness
from cadence.transport.inproc import InprocNetwork, InprocServer
from cadence.transport.session import NoAnswer, Paused, PeerLost, Session
from cadence.wire.messages import Heartbeat, Register, Shutdown, Welcome, WorkRequest
from tests.conftest import expect

pytestmark = pytest.mark.timeout(30)

WAIT = 5.0


@dataclass
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    dispatcher: InprocServer
    session: Session
    clock: FakeClock


@pytest.fixture
def rig(network: InprocNetwork) -> Iterator[Rig]:
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    clock = FakeClock()
    liveness = Liveness(interval_s=0.01, liveness=3, clock=clock)
    client = network.connect("trainer", "inproc://dispatcher", route=b"trainer")  # a route to reply to
    session = Session(client, "trainer", liveness, "inproc://t")
    yield Rig(dispatcher, session, clock)


async def forever() -> None:
    await asyncio.Event().wait()


async def test_registers_then_beats(rig: Rig) -> None:
    task = asyncio.create_task(rig.session.run(forever()))
    register = await expect(rig.dispatcher, Register)
    assert (register.role, register.address) == ("trainer", "inproc://t")
    assert (register.pid, register.host) == (os.getpid(), socket.gethostname())
    assert (await expect(rig.dispatcher, Heartbeat, timeout=WAIT)).role == "trainer"
    # the dispatcher not heard yet (it may have deferred the registration): the Register goes again
    assert (await expect(rig.dispatcher, Register, timeout=WAIT)).proof == register.proof
    await rig.dispatcher.send(b"trainer", Heartbeat("dispatcher"))
    await expect(rig.dispatcher, Heartbeat, timeout=WAIT, skip=(Register,))  # one may be on its way
    for _ in range(2):  # heard: heartbeats only
        assert (await expect(rig.dispatcher, Heartbeat, timeout=WAIT)).role == "trainer"
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_silent_dispatcher_is_named_with_how_long_it_was_silent(rig: Rig) -> None:
    task = asyncio.create_task(rig.session.run(forever()))
    await expect(rig.dispatcher, Register)
    rig.clock.now += 7.5  # past the timeout of 3 heartbeats, with no word from the dispatcher
    with pytest.raises(PeerLost, match="dispatcher silent for 7.5s") as lost:
        await asyncio.wait_for(task, WAIT)
    assert (lost.value.peer, lost.value.silent_s) == ("dispatcher", 7.5)


async def test_any_message_from_the_dispatcher_keeps_it_alive(rig: Rig) -> None:
    task = asyncio.create_task(rig.session.run(forever()))
    await expect(rig.dispatcher, Register)
    rig.clock.now += 0.02
    await rig.dispatcher.send(b"trainer", Heartbeat("dispatcher"))
    while rig.session.liveness.last_seen.get("dispatcher") != rig.clock.now:  # polled, ended by the timeout
        await asyncio.sleep(0.005)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_shutdown_ends_the_session_after_its_handler_and_cancels_the_work(rig: Rig) -> None:
    reasons: list[str] = []
    rig.session.on(Shutdown, lambda msg: reasons.append(msg.reason))
    work = asyncio.Event()

    async def working() -> None:
        try:
            await forever()
        finally:
            work.set()

    task = asyncio.create_task(rig.session.run(working()))
    await expect(rig.dispatcher, Register)
    await rig.dispatcher.send(b"trainer", Shutdown("run complete"))
    assert await asyncio.wait_for(task, WAIT) is None
    assert reasons == ["run complete"] and work.is_set()


async def test_a_shutdown_handler_that_raises_ends_the_session_with_its_error(rig: Rig) -> None:
    def refuse(msg: Shutdown) -> None:
        raise RuntimeError(f"stopped early: {msg.reason}")

    rig.session.on(Shutdown, refuse)
    task = asyncio.create_task(rig.session.run(forever()))
    await expect(rig.dispatcher, Register)
    await rig.dispatcher.send(b"trainer", Shutdown("trainer lost"))
    with pytest.raises(RuntimeError, match="stopped early: trainer lost"):
        await asyncio.wait_for(task, WAIT)


async def test_handled_messages_reach_their_handler_and_others_are_logged_not_raised(rig: Rig) -> None:
    welcomed: list[Welcome] = []
    rig.session.on(Welcome, welcomed.append)
    task = asyncio.create_task(rig.session.run(forever()))
    await expect(rig.dispatcher, Register)
    with structlog.testing.capture_logs() as logs:
        await rig.dispatcher.send(b"trainer", WorkRequest(3))  # nothing the session expects
        await rig.dispatcher.send(b"trainer", Welcome("inproc://t", "inproc://p", 0))
        deadline = asyncio.get_running_loop().time() + WAIT
        while not welcomed:
            assert asyncio.get_running_loop().time() < deadline, "the Welcome never reached its handler"
            await asyncio.sleep(0.005)
    assert not task.done()
    unexpected = [e for e in logs if e["event"] == "unexpected_message"]
    assert [(e["peer"], e["type"]) for e in unexpected] == [("dispatcher", "work_request")]
    assert welcomed == [Welcome("inproc://t", "inproc://p", 0)]
    await rig.dispatcher.send(b"trainer", Shutdown("test over"))
    await asyncio.wait_for(task, WAIT)


async def test_a_pause_of_this_process_is_not_blamed_on_the_dispatcher(network: InprocNetwork) -> None:
    """Stopped (SIGSTOP) past the liveness, the process heard nothing because it ran nothing: the
    session ends saying it was paused (the dispatcher has declared it lost), not that the dispatcher
    was silent."""
    dispatcher = network.bind("dispatcher", "inproc://dispatcher")
    clock, real = FakeClock(), FakeClock()
    liveness = Liveness(interval_s=0.01, liveness=3, clock=clock)
    session = Session(network.connect("w0", "inproc://dispatcher"), "rollout", liveness, monotonic=real)
    task = asyncio.create_task(session.run(forever()))
    await expect(dispatcher, Register)
    with structlog.testing.capture_logs() as logs:
        clock.now += 7.5  # both clocks jump: nothing of this process ran
        real.now += 7.5
        with pytest.raises(Paused, match="this rollout was paused for 7.5s, past the liveness of 0.03s"):
            await asyncio.wait_for(task, WAIT)
    (paused,) = [e for e in logs if e["event"] == "process_paused"]
    assert paused["paused_s"] == 7.5 and paused["role"] == "rollout"


async def test_a_dispatcher_that_never_answers_is_waited_for_then_named_with_its_address(
    network: InprocNetwork,
) -> None:
    """An actor started before its dispatcher (by hand, docs/hosts.md) waits `first_contact_s` for its
    first word, whatever the liveness says, then fails naming the address it tried."""
    clock = FakeClock()
    liveness = Liveness(interval_s=0.01, liveness=3, clock=clock)
    client = network.connect("w0", "inproc://nobody")
    session = Session(client, "rollout", liveness, first_contact_s=0.5)
    task = asyncio.create_task(session.run(forever()))
    clock.now += 7.5  # past the liveness: not yet a lost dispatcher, one that has not answered yet
    await asyncio.sleep(0.1)
    assert not task.done()
    with pytest.raises(
        NoAnswer, match=r"no answer from the dispatcher at inproc://nobody in [0-9.]+s \(transport"
    ):
        await asyncio.wait_for(task, WAIT)
