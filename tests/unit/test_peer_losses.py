"""The dispatcher's lost peers without sockets: a worker's prompts back to the queue, a lost trainer
failing the run or waited for, every silent peer lost even after the first failure."""

from __future__ import annotations

from cadence.dispatch.core import DispatchCore, Worker
from cadence.dispatch.losses import PeerLosses
from cadence.dispatch.roster import Peer
from cadence.dispatch.rounds import EvalRounds
from cadence.tasks.base import Prompt
from cadence.transport.heartbeat import Liveness

TRAINER, PUBLISHER, W1, W2 = b"t", b"p", b"w1", b"w2"


class Numbered:
    def prompts(self, period: int, count: int) -> list[Prompt]:
        return [Prompt(period * count + i, f"q{i}", str(i)) for i in range(count)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _setup(wait_for_trainer: bool) -> tuple[PeerLosses, DispatchCore, Liveness, Clock]:
    clock = Clock()
    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    core = DispatchCore(Numbered(), 3, 4, group_size=4, rounds=rounds)  # type: ignore[arg-type]
    peers = {
        TRAINER: Peer("trainer", "trainer", "a", welcomed=True),
        PUBLISHER: Peer("publisher", "publisher", "a", welcomed=True),
        W1: Peer("rollout-1", "rollout", "a", welcomed=True),
        W2: Peer("rollout-2", "rollout", "a", welcomed=True),
    }
    liveness = Liveness(1.0, 3, clock)
    for peer in peers.values():
        liveness.seen(peer.name)
    losses = PeerLosses(peers, core, liveness, clock, wait_for_trainer, wait_for_workers_s=60.0)
    core.announce(0, clock())
    core.credit(W1, 4)
    assert len(core.assign([Worker(W1, "rollout-1")], "key", clock())) == 4
    return losses, core, liveness, clock


def test_a_lost_worker_gives_its_prompts_back_and_is_named() -> None:
    losses, core, liveness, _ = _setup(wait_for_trainer=False)
    assert losses.lose("rollout-1", 3.5) is None
    assert losses.lost == ["rollout-1"] and losses.reassigned == 4 and core.ledger.queued == 4
    assert W1 not in losses.peers and "rollout-1" not in liveness.last_seen
    assert losses.lose("rollout-1", 3.5) is None and losses.lost == ["rollout-1"]  # gone already


def test_a_lost_trainer_fails_the_run_unless_the_run_waits_for_it() -> None:
    losses, _, _, _ = _setup(wait_for_trainer=False)
    assert losses.lose("trainer", 4.0) == "trainer lost (silent for 4.0s)"
    waiting, _, _, _ = _setup(wait_for_trainer=True)
    assert waiting.lose("trainer", 4.0) is None
    assert not waiting.peers[W1].welcomed and not waiting.peers[W2].welcomed  # held until it is back
    assert waiting.peers[PUBLISHER].welcomed and TRAINER not in waiting.peers


def test_every_silent_peer_is_lost_the_trainer_first_even_after_a_failure() -> None:
    losses, _, liveness, clock = _setup(wait_for_trainer=False)
    clock.now = 10.0  # all silent past 3 s
    failure = losses.lose_silent()
    assert failure is not None and failure.startswith("trainer lost")
    assert losses.peers == {} and liveness.last_seen == {}
    assert losses.lost == ["rollout-1", "rollout-2"] and losses.reassigned == 4
