"""Peers the dispatcher loses, and work held too long: what goes back to the queue, and when the
run fails.

```
 a worker lost (silent, re-registered) ─► what it held back to the front of the queue (the core),
                                          its name kept (`lost`), the prompts counted (`reassigned`)
 the trainer or publisher lost ─────────► trainer.on_loss = "fail": the run's failure, naming it
                                          "wait": every worker held until both are back (`Welcome`)
 an assignment held past the hold ──────► given to another worker (assignment_expired)
 no worker left while prompts wait ─────► said every 10 s; past rollout.wait_for_workers_s, a failure
```

Invariant: the roster (`peers`) is the dispatcher's own dict, shared: a lost peer leaves it here and
nowhere else; every method returns the run's failure (or None) rather than ending the run itself.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from cadence.dispatch.core import DispatchCore
from cadence.dispatch.roster import Peer, WorkerWait
from cadence.transport.heartbeat import Liveness

log = structlog.get_logger()


class PeerLosses:
    """`peers`: the dispatcher's roster by route; `wait_for_trainer`: trainer.on_loss is "wait"."""

    def __init__(
        self,
        peers: dict[bytes, Peer],
        core: DispatchCore,
        liveness: Liveness,
        clock: Callable[[], float],
        wait_for_trainer: bool,
        wait_for_workers_s: float,
    ) -> None:
        self.peers = peers
        self.core = core
        self.liveness = liveness
        self.clock = clock
        self.wait_for_trainer = wait_for_trainer
        self.worker_wait = WorkerWait(wait_for_workers_s)
        self.lost: list[str] = []  # the workers lost, in order
        self.reassigned = 0  # prompts given back to the queue from a worker lost or too slow

    def lose(self, name: str, silent_s: float, reason: str = "silent") -> str | None:
        """`name` is lost: off the roster and the liveness; the run's failure where it must end."""
        peer = next((k for k, p in self.peers.items() if p.name == name), None)
        if peer is None:
            return None
        info = self.peers.pop(peer)
        self.liveness.forget(name)
        if info.role != "rollout" and self.wait_for_trainer:
            self._await_trainer(info, silent_s, reason)
            return None
        if info.role != "rollout":
            who = name if name == info.role else f"{info.role} {name}"
            log.error("peer_lost", peer=name, role=info.role, silent_s=round(silent_s, 2), reason=reason)
            return f"{who} lost ({reason} for {silent_s:.1f}s)"
        back = self.core.leave(peer)
        self.reassigned += back
        self.lost.append(name)
        log.warning("worker_lost", peer=name, silent_s=round(silent_s, 2), reason=reason, requeued=back)
        return None

    def lose_silent(self) -> str | None:
        """Every peer silent past the liveness, the trainer first (when its process dies, the
        publisher it hosts goes silent with it); the first failure."""
        failure = None
        for name, silent in sorted(self.liveness.expired(), key=lambda e: self.role(e[0]) != "trainer"):
            found = self.lose(name, silent)
            failure = failure or found
        return failure

    def expire(self) -> bool:
        """Give another worker what a worker has held past the hold (it may be stuck, or hoarding);
        whether any was taken back."""
        deadlines = {route: round(self.core.deadline(route), 1) for route in self.core.credits}
        expired = self.core.expire(self.clock())
        for route, ids in expired.items():
            holder = self.peers[route].name if route in self.peers else "a worker gone"
            deadline = deadlines.get(route, round(self.core.hold.deadline(), 1))
            log.warning(
                "assignment_expired", peer=holder, period=self.core.period, prompt_ids=ids, held_s=deadline
            )
            self.reassigned += len(ids)
        return bool(expired)

    def check_workers(self) -> str | None:
        """Say so when prompts wait and no rollout worker is left, and when one is back; the failure
        once none has come for `wait_for_workers_s`."""
        workers = sum(1 for p in self.peers.values() if p.role == "rollout")
        core = self.core
        return self.worker_wait.check(
            workers, core.waiting, self.clock(), core.period, core.ledger.queued, self.lost
        )

    def role(self, name: str) -> str:
        return next((p.role for p in self.peers.values() if p.name == name), "")

    def _await_trainer(self, info: Peer, silent_s: float, reason: str) -> None:
        """A trainer (or its publisher) is gone but can come back from its resume checkpoint: hold
        every worker until both are there again (a fresh Welcome); a new trainer's first version
        names the period that starts over."""
        if info.role == "trainer":
            self.core.trainer_lost()
        for p in self.peers.values():
            p.welcomed = p.welcomed and p.role != "rollout"
        log.warning(
            "trainer_lost_waiting",
            peer=info.name,
            role=info.role,
            silent_s=round(silent_s, 2),
            reason=reason,
            period=self.core.period,
        )
