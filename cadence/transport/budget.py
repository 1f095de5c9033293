"""A byte budget per peer, and one for all peers together, for what a server refuses.

A route whose refused frames (not msgpack, another run's, malformed) come to more than `bytes_per_s`
within a one-second window has its further frames of that window dropped unread: not decoded, not
logged one by one, counted (`dropped`), and said once a window (`peer_muted`). A peer whose frames are
well-formed is never charged, so a busy real peer (a trainer uploading gigabytes of weights) is never
muted; a peer sending garbage at full speed costs its server the reads and nothing more. Many routes
(a stranger's many connections) are bounded together too: once the window's refused bytes of all
routes come to `TOGETHER` times a route's budget, every route refused in that window is muted for the
rest of it, so what strangers make a server read, peek at and refuse does not grow with their
connections.

Invariant: what a route is charged is forgotten when its window ends; the budget holds only the routes
charged within the current window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_REFUSED_BYTES_PER_S = 64 << 20
TOGETHER = 2
"""All routes' refused bytes within a window, in routes' budgets, past which each refused route is muted."""


class RefusedBudget:
    """Bytes of refused frames each route may send within a window of `window_s` seconds."""

    def __init__(
        self,
        bytes_per_s: int = DEFAULT_REFUSED_BYTES_PER_S,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = 1.0,
    ) -> None:
        self.bytes_per_s = bytes_per_s
        self.clock = clock
        self.window_s = window_s
        self.dropped = 0  # frames dropped unread from muted routes
        self.together = TOGETHER * bytes_per_s
        self._total = 0  # all routes' refused bytes this window
        self._start = clock()
        self._spent: dict[bytes, int] = {}
        self._muted: set[bytes] = set()

    def _roll(self) -> None:
        now = self.clock()
        if now - self._start >= self.window_s:
            self._start = now
            self._total = 0
            self._spent.clear()
            self._muted.clear()

    def muted(self, route: bytes) -> bool:
        """Whether `route`'s frames are dropped unread for the rest of this window (counted if so)."""
        self._roll()
        if route in self._muted:
            self.dropped += 1
            return True
        return False

    def charge(self, route: bytes, nbytes: int) -> bool:
        """Charge a refused frame of `nbytes` to `route`; True when this one exhausts its budget (its
        own, or all routes' together)."""
        self._roll()
        spent = self._spent.get(route, 0) + nbytes
        self._spent[route] = spent
        self._total += nbytes
        over = spent > self.bytes_per_s or self._total > self.together
        if over and route not in self._muted:
            self._muted.add(route)
            return True
        return False
