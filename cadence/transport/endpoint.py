"""The two shapes of channel every actor uses, and the one place frames are refused.

Invariant: `recv` returns only valid messages of this run; every refused frame is logged (with
rate limiting) with who sent it and why, counted in `refused`, and the caller never sees it; a route
past its budget of refused bytes (`budget.py`) has its frames dropped unread for the rest of the window;
a server's frame is sized before it is decoded, and a large one is decoded only where its actor admits
it (`admission.py`).

- `Server`: bound, many peers; `recv()` gives `(peer, envelope)`, `send(peer, msg)` replies,
  `reachable(peer)` says whether a connection still has that route.
- `Client`: connected to one server; `send(msg)`, `recv()`.

A client's route (the identity its server replies to) is its name, `#`, and a random token made anew
for every client (`new_route`): a peer that knows an actor's name cannot present its route and so take
over its replies. The token never appears in a log line (`shown`).

`zmq_socket.py` implements them over ZeroMQ (ROUTER/DEALER), `inproc.py` over asyncio queues
for actor tests; both go through the same codec here. A message is a list of frames (a header, and a
payload for weight chunks); payload frames are handed over and received without copies.
"""

from __future__ import annotations

import abc
import secrets

import structlog

from cadence.log import Throttle
from cadence.transport.admission import Admission
from cadence.transport.budget import DEFAULT_REFUSED_BYTES_PER_S, RefusedBudget
from cadence.wire.messages import (
    DEFAULT_MAX_FRAME_BYTES,
    DecodeError,
    Envelope,
    Message,
    Payload,
    decode_frames,
    encode_frames,
)

log = structlog.get_logger()

ROUTE_TOKEN_BYTES = 12
"""Random bytes in a route: 96 bits, hex-encoded after the name."""


def new_route(name: str) -> bytes:
    """A fresh, unguessable route for a client named `name`: `name#<24 hex digits>`."""
    return f"{name}#{secrets.token_hex(ROUTE_TOKEN_BYTES)}".encode()


def shown(route: bytes) -> str:
    """A route as a log line may show it: the name, never the token."""
    return route.decode("utf-8", "backslashreplace").rpartition("#")[0] or _show(route)


class RefusalLog:
    """Counts refused frames; logs the first few each second, and how many were held back."""

    def __init__(self, where: str, per_second: int = 5) -> None:
        self.where = where
        self.total = 0
        self._throttle = Throttle(per_second)

    def refuse(self, peer: str, error: DecodeError, role: str | None = None) -> None:
        """Count and (within the rate) log a refused frame; `role`: the sender's role, for a message
        the codec took but its actor may not (see `cadence.wire.roles`)."""
        self.total += 1
        shown, held = self._throttle.allow()
        if not shown:
            return
        if held:
            log.warning("messages_refused_suppressed", channel=self.where, count=held)
        log.warning(
            "message_refused",
            channel=self.where,
            peer=peer,
            sender=error.sender,
            type=error.type_tag,
            reason=error.reason,
            refused_total=self.total,
            **({} if role is None else {"role": role}),
        )


class _Codec:
    def __init__(self, name: str, run: str, max_frame_bytes: int) -> None:
        self.name = name
        self.run = run
        self.max_frame_bytes = max_frame_bytes
        self.refusals = RefusalLog(name)

    @property
    def refused(self) -> int:
        return self.refusals.total

    def refuse(self, sender: str, role: str, msg: Message, reason: str) -> None:
        """Refuse a decoded message from `sender` (whose role is `role`) that its actor may not act on:
        counted and logged with the codec's refusals."""
        self.refusals.refuse(sender, DecodeError(reason, msg.TAG, sender), role)

    def _encode(self, msg: Message) -> list[Payload]:
        return encode_frames(msg, sender=self.name, run=self.run)

    def _decode(self, frames: list[Payload], peer: str) -> Envelope | None:
        try:
            env = decode_frames(frames, self.max_frame_bytes)
        except DecodeError as err:
            self.refusals.refuse(peer, err)
            return None
        if self.run and env.run != self.run:
            reason = f"message of run {env.run!r}, this is run {self.run!r}"
            self.refusals.refuse(peer, DecodeError(reason, env.message.TAG, env.sender))
            return None
        return env


class Server(_Codec, abc.ABC):
    """A bound endpoint that many clients send to and that replies to each by peer id."""

    address: str

    def __init__(
        self,
        name: str,
        run: str = "",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        refused_bytes_per_s: int = DEFAULT_REFUSED_BYTES_PER_S,
    ) -> None:
        super().__init__(name, run, max_frame_bytes)
        self.budget = RefusedBudget(refused_bytes_per_s)
        self.admission = Admission(max_bytes=max_frame_bytes)  # its actor says whom it knows

    async def recv(self) -> tuple[bytes, Envelope]:
        while True:
            peer, frames = await self._recv_raw()
            if self.budget.muted(peer):  # past its budget of refused bytes: dropped unread
                continue
            undecoded = self.admission.problem(peer, frames[0]) if frames else None
            if undecoded is not None:
                self.refusals.refuse(shown(peer), undecoded)
                env = None
            else:
                env = self._decode(frames, shown(peer))
            if env is not None:
                return peer, env
            if self.budget.charge(peer, sum(memoryview(f).nbytes for f in frames)):
                log.warning(
                    "peer_muted",
                    channel=self.name,
                    peer=shown(peer),
                    refused_bytes_per_s=self.budget.bytes_per_s,
                    for_s=self.budget.window_s,
                    dropped_total=self.budget.dropped,
                )

    async def send(self, peer: bytes, msg: Message) -> None:
        """Send `msg` to the client whose route is `peer`; dropped, as a ROUTER drops it, when no
        connection has that route or the peer is not reading."""
        await self._send_raw(peer, self._encode(msg))

    def frames_of(self, msg: Message) -> list[Payload]:
        """`msg` encoded as this server sends it, to be sent (`send_frames`) once or to many peers."""
        return self._encode(msg)

    async def send_frames(self, peer: bytes, frames: list[Payload]) -> None:
        """Send frames made by `frames_of` to `peer`: their buffers go out as they are, not copied."""
        await self._send_raw(peer, frames)

    async def send_each(self, peers: list[bytes], msg: Message) -> None:
        """Send `msg` to every route in `peers`, encoded once: their queues share its bytes."""
        frames = self._encode(msg)
        for peer in peers:
            await self._send_raw(peer, frames)

    @abc.abstractmethod
    def reachable(self, peer: bytes) -> bool:
        """Whether a connection still has the route `peer` (it may be sent a heartbeat to find out)."""

    @abc.abstractmethod
    async def _recv_raw(self) -> tuple[bytes, list[Payload]]: ...

    @abc.abstractmethod
    async def _send_raw(self, peer: bytes, frames: list[Payload]) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class Client(_Codec, abc.ABC):
    """A connected endpoint talking to one server."""

    def __init__(
        self, name: str, address: str, run: str = "", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        super().__init__(name, run, max_frame_bytes)
        self.address = address

    async def recv(self) -> Envelope:
        while True:
            env = self._decode(await self._recv_raw(), self.address)
            if env is not None:
                return env

    async def send(self, msg: Message) -> None:
        await self._send_raw(self._encode(msg))

    @abc.abstractmethod
    async def _recv_raw(self) -> list[Payload]: ...

    @abc.abstractmethod
    async def _send_raw(self, frames: list[Payload]) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


def _show(peer: bytes) -> str:
    return peer.decode("utf-8", "backslashreplace")
