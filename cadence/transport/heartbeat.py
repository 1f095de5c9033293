"""Liveness: who was heard from when, and who has been silent too long.

Invariant: a peer is declared dead exactly once, after `interval_s * liveness` seconds without any
message from it, and is forgotten then; hearing from it again makes it a new peer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Liveness:
    interval_s: float
    liveness: int
    clock: Callable[[], float]
    last_seen: dict[str, float] = field(default_factory=dict)

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.liveness

    def seen(self, peer: str) -> bool:
        """Record a message from `peer`; True when it was not known before."""
        new = peer not in self.last_seen
        self.last_seen[peer] = self.clock()
        return new

    def forget(self, peer: str) -> None:
        self.last_seen.pop(peer, None)

    def expired(self) -> list[tuple[str, float]]:
        """Peers silent for longer than the timeout, with how long; they are forgotten."""
        now = self.clock()
        dead = [(p, now - t) for p, t in self.last_seen.items() if now - t > self.timeout_s]
        for peer, _ in dead:
            del self.last_seen[peer]
        return dead
