"""ZeroMQ channels: a ROUTER `Server` bound to an address and DEALER `Client`s connected to it.

Invariant: sockets never linger after `close`; a client's route is its name and a random token
(`endpoint.new_route`), so only the client itself takes its route over when it reconnects
(ROUTER_HANDOVER), never another socket that borrows its name; a server never blocks on a send (a
message to a route no connection has, or to a peer that does not read, is dropped, as a ROUTER
drops it) and can tell whether a route is still connected (`reachable`, ROUTER_MANDATORY). Frames are
sent and received with `copy=False`: a payload goes from the sender's buffer to the wire, and from
the wire to the receiver as a view of ZeroMQ's message, without a copy in Python. A network given
a keys folder encrypts every socket with CURVE, and its servers accept only authorized client keys.
Every receive gives the event loop a turn: a frame already waiting is received without one, so a
peer sending faster than this process reads (a flood of garbage) would starve its other tasks.
A server bound on TCP without keys logs `unencrypted_bind` once, naming the risk (beyond loopback,
whoever reaches the host; on loopback, any other user of it) and the fix;
one bound at `LOCAL` (`transport.listen = "ipc"`) is reachable by this user's processes on this host
alone.
What a peer can make a socket hold is bounded in bytes: a connection's queue of at most
`receive_queue` messages (RCVHWM), each frame of at most `cut_off(max_frame_bytes)` (MAXMSGSIZE); a
server drops unread what a route sends past its budget of refused bytes (`budget.py`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
from pathlib import Path
from typing import cast

import structlog
import zmq
import zmq.asyncio

from cadence.transport.budget import DEFAULT_REFUSED_BYTES_PER_S
from cadence.transport.curve import CurveGate
from cadence.transport.endpoint import Client, Server, new_route
from cadence.transport.keys import CurveKeys
from cadence.transport.socket_folders import new_socket_folder
from cadence.wire.messages import DEFAULT_MAX_FRAME_BYTES, Heartbeat, Payload

log = structlog.get_logger()


def beyond_loopback(address: str) -> bool:
    """Whether a server bound at `address` can be reached from other machines (tcp on any interface
    but loopback; inproc and ipc stay on this one)."""
    if not address.startswith("tcp://"):
        return False
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface or host name
        return True


def _unkeyed_risk(address: str) -> str:
    """What a server on TCP without keys lets others do."""
    who = "anyone who can reach this address" if beyond_loopback(address) else "any other user of this host"
    return (
        f"{who} and learns the run id (config.json) can join the run, send it work results and read its"
        " weights" + ("; nothing is encrypted" if beyond_loopback(address) else "")
    )


LOCAL = "ipc://*"
"""A server bound here listens on a Unix socket in a folder of its own, mode 0700: only processes of
this user on this host reach it."""


def listen_address(listen: str, host: str, port: int = 0, advertise_host: str = "") -> str:
    """Where a server listens (`transport.listen`): `LOCAL`, or tcp on `host` at `port` (0: any).

    "auto" is `LOCAL` where tcp could be reached from this host alone anyway (`host` on loopback,
    nothing advertised, no fixed port: nobody is told of a way in from elsewhere) and Unix sockets
    exist; else tcp. So a run on one host is reachable by its own user alone by default."""
    tcp = f"tcp://{host}:{port or '*'}"
    if listen == "ipc":
        return LOCAL
    local_only = not beyond_loopback(tcp) and not advertise_host and not port
    return LOCAL if listen == "auto" and local_only and zmq.has("ipc") else tcp


DEFAULT_RECEIVE_QUEUE = 8
"""Messages a socket queues from one connection before it stops reading that connection."""


def cut_off(max_frame_bytes: int) -> int:
    """The frame size past which libzmq drops the connection unread: the codec's limit and a margin,
    so a frame just above the limit still reaches the codec and is refused with a log line."""
    return max_frame_bytes + max(4096, max_frame_bytes // 8)


def _socket(
    ctx: zmq.asyncio.Context, kind: int, max_frame_bytes: int, receive_queue: int
) -> zmq.asyncio.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, cut_off(max_frame_bytes))
    # what one connection may hold here: receive_queue messages of at most the cut-off each; a
    # sender beyond it waits (a DEALER) or loses its messages (a ROUTER), this process does not grow
    sock.setsockopt(zmq.RCVHWM, receive_queue)
    return sock


class ZmqServer(Server):
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        name: str,
        address: str,
        run: str = "",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        gate: CurveGate | None = None,
        receive_queue: int = DEFAULT_RECEIVE_QUEUE,
        refused_bytes_per_s: int = DEFAULT_REFUSED_BYTES_PER_S,
    ) -> None:
        super().__init__(name, run, max_frame_bytes, refused_bytes_per_s)
        self._sock = _socket(ctx, zmq.ROUTER, max_frame_bytes, receive_queue)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to an unknown route says so
        self._gate = gate
        if gate is not None:
            gate.guard(self._sock, name)
        self._local_dirs: list[str] = []
        self._sock.bind(self._private() if address == LOCAL else address)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def _private(self) -> str:
        """An ipc:// address in a new directory of this process's own (mode 0700)."""
        folder = new_socket_folder()
        self._local_dirs.append(folder)
        return f"ipc://{folder}/{self.name}.sock"

    def bind_local(self) -> str:
        """Serve at an ipc:// address too, a Unix socket in a directory of this process's own (mode
        0700: only this user's processes reach it), for peers on this host: 537 MB through it take
        0.17-0.22 s here, against 0.34-0.39 s through TCP loopback. "" where ipc is not available."""
        if self.address.startswith("ipc://"):  # it listens there alone already
            return self.address
        if not zmq.has("ipc"):
            return ""
        self._sock.bind(self._private())
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def _recv_raw(self) -> tuple[bytes, list[Payload]]:
        await asyncio.sleep(0)  # a turn for the other tasks, however many frames are waiting
        frames = await self._sock.recv_multipart(copy=False)
        return frames[0].bytes, [f.buffer for f in frames[1:]]

    async def _send_raw(self, peer: bytes, frames: list[Payload]) -> None:
        self._deliver(peer, frames)

    def _deliver(self, peer: bytes, frames: list[Payload]) -> bool:
        """Hand `frames` to the route `peer` without waiting; False when no connection has it."""
        # with DONTWAIT the asyncio socket sends at once and hands back a finished future
        sent = cast("asyncio.Future[None]", self._sock.send_multipart([peer, *frames], zmq.DONTWAIT, False))
        err = sent.exception() if sent.done() else None
        if isinstance(err, zmq.Again):  # the peer's queue is full: dropped, but the route is there
            return True
        if isinstance(err, zmq.ZMQError) and err.errno == zmq.EHOSTUNREACH:
            return False
        if err is not None:
            raise err
        return True

    def reachable(self, peer: bytes) -> bool:
        return self._deliver(peer, self._encode(Heartbeat(self.name)))

    def close(self) -> None:
        if self._gate is not None:
            self._gate.release(self._sock)
        self._sock.close(linger=0)
        self.remove_folders()

    def remove_folders(self) -> None:
        """Remove the folders of its ipc:// sockets (with the socket files, if libzmq left them)."""
        for folder in self._local_dirs:
            shutil.rmtree(folder, ignore_errors=True)


class ZmqClient(Client):
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        name: str,
        address: str,
        run: str = "",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        keys: CurveKeys | None = None,
        receive_queue: int = DEFAULT_RECEIVE_QUEUE,
    ) -> None:
        super().__init__(name, address, run, max_frame_bytes)
        self._sock = _socket(ctx, zmq.DEALER, max_frame_bytes, receive_queue)
        self.route = new_route(name)
        self._sock.setsockopt(zmq.IDENTITY, self.route)
        if keys is not None:
            self._sock.curve_publickey, self._sock.curve_secretkey = keys.client_pair()
            self._sock.curve_serverkey = keys.server_public()
        self._sock.connect(address)

    async def _recv_raw(self) -> list[Payload]:
        await asyncio.sleep(0)  # a turn for the other tasks, however many frames are waiting
        return [f.buffer for f in await self._sock.recv_multipart(copy=False)]

    async def _send_raw(self, frames: list[Payload]) -> None:
        await self._sock.send_multipart(frames, copy=False)

    def close(self) -> None:
        self._sock.close(linger=0)


class ZmqNetwork:
    """Makes ZeroMQ servers and clients for one run; owns the context.

    With `keys` (a folder made by `cadence keys`) every socket uses CURVE: a server must be bound
    inside a running event loop, where its ZAP handler and refusal log run.
    """

    def __init__(
        self,
        run: str = "",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        keys: Path | None = None,
        receive_queue: int = DEFAULT_RECEIVE_QUEUE,
        refused_bytes_per_s: int = DEFAULT_REFUSED_BYTES_PER_S,
    ) -> None:
        self.keys = CurveKeys(keys) if keys is not None else None
        self.receive_queue = receive_queue
        self.refused_bytes_per_s = refused_bytes_per_s
        self.ctx = zmq.asyncio.Context()
        self.run = run
        self.max_frame_bytes = max_frame_bytes
        self.gate = CurveGate(self.ctx, self.keys) if self.keys is not None else None
        self._servers: list[ZmqServer] = []

    def bind(self, name: str, address: str) -> ZmqServer:
        if self.keys is None and address.startswith("tcp://"):
            log.warning(
                "unencrypted_bind",
                server=name,
                address=address,
                risk=_unkeyed_risk(address),
                fix="make keys with `cadence keys DIR`, copy DIR to every host and set transport.keys = DIR"
                + ("" if beyond_loopback(address) else "; or listen on a Unix socket (transport.listen)"),
            )
        server = ZmqServer(
            self.ctx,
            name,
            address,
            self.run,
            self.max_frame_bytes,
            self.gate,
            self.receive_queue,
            self.refused_bytes_per_s,
        )
        self._servers.append(server)
        return server

    def connect(self, name: str, address: str) -> ZmqClient:
        return ZmqClient(
            self.ctx, name, address, self.run, self.max_frame_bytes, self.keys, self.receive_queue
        )

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        self.ctx.destroy(linger=0)
        for server in self._servers:  # a server its actor did not close leaves no folder behind
            server.remove_folders()
