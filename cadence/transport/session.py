"""An actor's session with the dispatcher: register, heartbeat, listen, until Shutdown.

```
 run(work…) ─► Register(role, address, pid, host, key, proof) ─► dispatcher seen
            ─► together, until the first ends:
               work…                     the actor's own loops
               beat:   Heartbeat(role) every interval_s (the Register again in its place until the
                       dispatcher is heard: it may have deferred it); never heard: waiting_for_dispatcher
                       every 10 s, NoAnswer after first_contact_s (it may start after this actor);
                       once heard, a peer silent > liveness ─► PeerLost
                       this process itself not run for > liveness (SIGSTOP, a suspended VM)
                         ─► process_paused, Paused: the silence was its own, and the dispatcher
                            has declared it lost (what it held went to others)
               listen: any message       ─► the dispatcher is seen
                       Heartbeat         ─► nothing more
                       Shutdown          ─► its handler (which may raise), then the session ends;
                                            one refusing the registration ─► Refused, naming why
                       a handled type    ─► its handler (an exception it raises: logged, listening goes on)
                       anything else     ─► unexpected_message(peer, type), and listening goes on
```

A process's log lines (`beside`, its log stream) go out on the session itself, after its Register:
the dispatcher takes them only from a registered route and under that route's own name.

A session is new at every start: its `proof` (shown only in its Register) and its trainer's `key`
are random, and a trainer's word (`roles.SIGNED`) leaves signed with that key.

Invariant: a dispatcher that stays silent past its liveness, while this process runs, ends the
session with `PeerLost` naming it and how long it was silent; a pause of this process past the
liveness ends it with `Paused`, never blamed on the dispatcher; a message the actor has no handler for is logged and
dropped, never raised; the session ends at the first Shutdown.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import structlog

from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.wire.messages import Heartbeat, Message, Register, Shutdown
from cadence.wire.roles import SIGNED, new_key, sign

log = structlog.get_logger()

M = TypeVar("M", bound=Message)

FIRST_CONTACT_SAY_S = 10.0
"""How often an actor still waiting for the dispatcher's first word says so."""


class PeerLost(RuntimeError):
    """A peer stopped answering."""

    def __init__(self, peer: str, silent_s: float) -> None:
        super().__init__(f"{peer} silent for {silent_s:.1f}s")
        self.peer = peer
        self.silent_s = silent_s


class NoAnswer(PeerLost):
    """The dispatcher never answered: not started yet past the wait, or not at that address."""

    def __init__(self, address: str, waited_s: float) -> None:
        RuntimeError.__init__(
            self,
            f"no answer from the dispatcher at {address} in {waited_s:.1f}s (transport.first_contact_s):"
            " is it running, and is that its address?",
        )
        self.peer = "dispatcher"
        self.silent_s = waited_s


class Refused(RuntimeError):
    """The dispatcher refused this actor's registration; the message says why."""


class Paused(RuntimeError):
    """This process did not run for longer than its peers' liveness: they have declared it lost."""

    def __init__(self, role: str, paused_s: float, timeout_s: float) -> None:
        super().__init__(
            f"this {role} was paused for {paused_s:.1f}s, past the liveness of {timeout_s:g}s: the"
            " dispatcher has declared it lost and given its work to others; start it again to rejoin"
        )
        self.paused_s = paused_s


class Session:
    """The session of actor `role` (serving at `address`, if anywhere) with the dispatcher behind
    `dispatcher`; `liveness` decides how often to beat and how long the dispatcher may be silent."""

    TAKES: ClassVar[tuple[type[Message], ...]] = (Heartbeat, Shutdown)
    """What every session takes from the dispatcher itself; an actor adds its own handlers (`on`)."""

    def __init__(
        self,
        dispatcher: Client,
        role: str,
        liveness: Liveness,
        address: str = "",
        peer: str = "dispatcher",
        monotonic: Callable[[], float] = time.monotonic,
        local: str = "",
        secret: str = "",
        beside: Callable[[], Coroutine[Any, Any, None]] | None = None,
        first_contact_s: float = 0.0,
    ) -> None:
        self.dispatcher = dispatcher
        self.beside = beside  # a loop on this session once registered (the process's log stream)
        self.first_contact_s = first_contact_s  # the wait for the dispatcher's first word (0: liveness)
        self.heard = False
        self.local = local  # an ipc:// address it also serves at, for peers on its host
        self.secret = secret  # the run's, which a trainer or publisher shows when it registers
        self.monotonic = monotonic  # real time, to tell this process's own pauses
        self.role = role
        self.liveness = liveness
        self.address = address
        self.peer = peer
        self.key = new_key()  # a trainer's tickets and MACs are made with it (`cadence.wire.roles`)
        self.proof = new_key()  # shown to the dispatcher once: a later claim of its name must show it
        self._handlers: dict[type[Message], Callable[[Any], None]] = {}

    def on(self, kind: type[M], handler: Callable[[M], None]) -> None:
        """Call `handler` with every message of type `kind` from the dispatcher; for `Shutdown`, before
        the session ends (an exception it raises ends the session with that exception)."""
        self._handlers[kind] = handler

    async def send(self, msg: Message) -> None:
        """Send `msg` to the dispatcher; a trainer's word (`roles.SIGNED`) signed with its key."""
        if self.role == "trainer" and msg.TAG in SIGNED:
            msg = sign(self.key, msg)
        await self.dispatcher.send(msg)

    async def run(self, *work: Coroutine[Any, Any, Any]) -> Any:
        """Register, then run `work` with the heartbeats and the listener until the first of them ends
        (Shutdown ends the listener); the others are cancelled. What that first one returned."""
        await self.send(self._register())
        self.liveness.seen(self.peer)
        also = [self.beside()] if self.beside is not None else []
        return await first_of(*work, self.listen(), self.beat(), *also)

    def _register(self) -> Register:
        key = self.key if self.role == "trainer" else ""
        return Register(
            self.role,
            self.address,
            os.getpid(),
            socket.gethostname(),
            key,
            self.local,
            self.proof,
            self.secret,
        )

    async def beat(self) -> None:
        """Heartbeat the dispatcher forever; raise `PeerLost` once any peer has been silent too long
        while this process ran, `Paused` once this process itself did not run for that long."""
        last = began = said = self.monotonic()
        first = True
        while True:
            # until the dispatcher is heard, the registration goes again in the heartbeat's place: one
            # it deferred (more registrations at once than it takes: `roster.Registrations`) is retried
            again = not first and not self.heard
            await self.send(self._register() if again else Heartbeat(self.role))
            first = False
            now = self.monotonic()
            if now - last > self.liveness.timeout_s:  # nothing ran here: the peers could not be heard
                log.warning("process_paused", role=self.role, paused_s=round(now - last, 1))
                raise Paused(self.role, now - last, self.liveness.timeout_s)
            if not self.heard and self.first_contact_s > 0:  # it may start after this actor
                if now - began > self.first_contact_s:
                    raise NoAnswer(self.dispatcher.address, now - began)
                self.liveness.seen(self.peer)
                if now - said >= FIRST_CONTACT_SAY_S:
                    said = now
                    log.info("waiting_for_dispatcher", address=self.dispatcher.address,
                             waited_s=round(now - began), limit_s=self.first_contact_s)  # fmt: skip
            for peer, silent in self.liveness.expired():
                raise PeerLost(peer, silent)
            last = now
            await asyncio.sleep(self.liveness.interval_s)

    async def listen(self) -> None:
        """Take the dispatcher's messages until Shutdown."""
        while True:
            env = await self.dispatcher.recv()
            self.heard = True
            self.liveness.seen(self.peer)
            msg = env.message
            handler = self._handlers.get(type(msg))
            if isinstance(msg, Shutdown):
                log.info("shutdown", reason=msg.reason)
                if msg.refused:  # this actor cannot take part: it fails, saying why
                    raise Refused(msg.reason)
                if handler is not None:
                    handler(msg)
                return
            if handler is not None:
                try:
                    handler(msg)
                except Exception as exc:  # contained to this message: the session goes on
                    log.error("message_failed", peer=env.sender, type=msg.TAG, error=repr(exc), exc_info=True)
            elif not isinstance(msg, Heartbeat):  # nothing here acts on it: said, never dropped silently
                log.warning(
                    "unexpected_message",
                    channel=self.role,
                    peer=env.sender,
                    type=msg.TAG,
                    reason=f"this {self.role} has no handler for {msg.TAG}",
                )


async def first_of(*coros: Coroutine[Any, Any, Any]) -> Any:
    """Run the coroutines together; when one returns or raises, cancel the rest and pass it on."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next(iter(done)).result()
