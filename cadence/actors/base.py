"""What every actor shares: keeping a peer alive, and running loops until the first one ends.

Invariant: a peer that stays silent past its liveness is reported by raising `PeerLost` with its
name and how long it was silent; no actor waits forever on a dead peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.wire.messages import Heartbeat


class PeerLost(RuntimeError):
    """A peer stopped answering."""

    def __init__(self, peer: str, silent_s: float) -> None:
        super().__init__(f"{peer} silent for {silent_s:.1f}s")
        self.peer = peer
        self.silent_s = silent_s


async def keep_alive(client: Client, role: str, liveness: Liveness) -> None:
    """Heartbeat `client`'s server forever; raise `PeerLost` when it has been silent too long."""
    while True:
        await client.send(Heartbeat(role))
        for peer, silent in liveness.expired():
            raise PeerLost(peer, silent)
        await asyncio.sleep(liveness.interval_s)


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
