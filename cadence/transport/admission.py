"""What a server decodes, and for whom: a frame is sized before it is decoded.

A header frame of at most `small_bytes` (every message a peer sends before it has proved anything: a
registration, a heartbeat, a follower's subscription, a weight request) is decoded as it comes. A
larger one is decoded only for a peer its actor knows (`known`: a registered route at the dispatcher)
or that shows, in the few fields its type declares as its proof (`codec.peek`, the rest of the frame
skipped unread, about 1.3 ms a MiB here), that it may send it (`proves`: a group with its assignment's
ticket at the trainer); any other is refused undecoded, with the reason. msgspec holds the GIL while it
decodes (a 10 ms ticker in another thread waited 1.2 s through a 63 MiB group's decode), so a thread
would not keep the event loop turning: what keeps a stranger from starving a heartbeat is that a
stranger's large frame is never decoded.

Invariant: a frame whose header is larger than `small_bytes` reaches the codec's full decode only from a
route `known` says yes to, or after `proves` accepted what `peek` read of it.
"""

from __future__ import annotations

from collections.abc import Callable

from cadence.wire.messages import DEFAULT_MAX_FRAME_BYTES, DecodeError, Payload, Peek, peek

SMALL_FRAME_BYTES = 64 << 10
"""The largest header frame decoded from a peer that has not proved itself: every message a stranger
may send (a registration, a subscription, a weight request) is far below it."""

Known = Callable[[bytes], bool]
"""Whether a route is known to its actor (a registered peer's): its large frames are decoded."""
Proves = Callable[[bytes, Peek], str | None]
"""Why a large frame from a route not known may not be decoded, from what `peek` read of it, or None."""


class Admission:
    """Which frames a server decodes: all small ones; large ones from `known` routes, or that `proves`
    accepts (neither set: none)."""

    def __init__(
        self,
        small_bytes: int = SMALL_FRAME_BYTES,
        max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        known: Known | None = None,
        proves: Proves | None = None,
    ) -> None:
        self.small_bytes = small_bytes
        self.max_bytes = max_bytes
        self.known = known
        self.proves = proves
        self.undecoded = 0  # large frames refused without being decoded

    def problem(self, route: bytes, header: Payload) -> DecodeError | None:
        """Why the frame `header` from `route` is not to be decoded, or None."""
        size = memoryview(header).nbytes
        if size <= self.small_bytes or (self.known is not None and self.known(route)):
            return None
        if self.proves is None:  # nothing it could show: not even peeked at
            self.undecoded += 1
            return DecodeError(f"frame of {size} bytes (over {self.small_bytes}) from a peer not known"
                               " here; not decoded")  # fmt: skip
        try:
            seen = peek(header, self.max_bytes)
        except DecodeError as err:
            self.undecoded += 1
            return err
        why = self.proves(route, seen)
        if why is None:
            return None
        self.undecoded += 1
        reason = f"{seen.tag} of {size} bytes (over {self.small_bytes}) from a peer not known here: {why}"
        return DecodeError(f"{reason}; not decoded", seen.tag, seen.sender)
