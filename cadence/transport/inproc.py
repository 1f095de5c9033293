"""In-process channels with the ZeroMQ channels' interface, for driving actors in tests.

Invariant: frames pass through the same codec as on the wire, and a client's route is made as a
socket's is (`endpoint.new_route`, or one a test names to play a peer that borrows it), so a test
that feeds an actor through these channels exercises exactly the validation a socket peer meets.
"""

from __future__ import annotations

import asyncio
import itertools

from cadence.transport.endpoint import Client, Server, new_route
from cadence.wire.messages import DEFAULT_MAX_FRAME_BYTES, Payload


class InprocServer(Server):
    def __init__(self, network: InprocNetwork, name: str, address: str) -> None:
        super().__init__(name, network.run, network.max_frame_bytes)
        self.address = address
        self.inbox: asyncio.Queue[tuple[bytes, list[Payload]]] = asyncio.Queue()
        self._network = network

    async def _recv_raw(self) -> tuple[bytes, list[Payload]]:
        return await self.inbox.get()

    async def _send_raw(self, peer: bytes, frames: list[Payload]) -> None:
        client = self._network.clients.get((self.address, peer))
        if client is not None:  # like a ROUTER, an unknown peer's message is dropped
            client.inbox.put_nowait(frames)

    def reachable(self, peer: bytes) -> bool:
        return (self.address, peer) in self._network.clients

    def close(self) -> None:
        self._network.servers.pop(self.address, None)


class InprocClient(Client):
    def __init__(self, network: InprocNetwork, name: str, address: str, route: bytes | None = None) -> None:
        super().__init__(name, address, network.run, network.max_frame_bytes)
        self.inbox: asyncio.Queue[list[Payload]] = asyncio.Queue()
        self._network = network
        self.route = route or new_route(name)
        network.clients[(address, self.route)] = self  # a second client on a route takes it over

    async def _recv_raw(self) -> list[Payload]:
        return await self.inbox.get()

    async def _send_raw(self, frames: list[Payload]) -> None:
        await self.send_frames(frames)

    async def send_frames(self, frames: list[Payload]) -> None:
        """Raw frames, bypassing the codec: how a test plays a hostile peer."""
        server = self._network.servers.get(self.address)
        if server is not None:
            server.inbox.put_nowait((self.route, frames))

    def close(self) -> None:
        self._network.clients.pop((self.address, self.route), None)


class InprocNetwork:
    """Servers by address and clients by (address, route), inside one event loop."""

    def __init__(self, run: str = "", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.run = run
        self.max_frame_bytes = max_frame_bytes
        self.servers: dict[str, InprocServer] = {}
        self.clients: dict[tuple[str, bytes], InprocClient] = {}
        self._ids = itertools.count()

    def bind(self, name: str, address: str) -> InprocServer:
        if address.endswith("*"):
            address = f"{address[:-1]}{next(self._ids)}"
        server = InprocServer(self, name, address)
        self.servers[address] = server
        return server

    def connect(self, name: str, address: str, route: bytes | None = None) -> InprocClient:
        """A client named `name`; `route`: the route it presents (default: a fresh one)."""
        return InprocClient(self, name, address, route)

    def close(self) -> None:
        self.servers.clear()
        self.clients.clear()
