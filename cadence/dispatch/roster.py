"""The dispatcher's roster: who is registered as what, who may claim a role or a name, what each peer
is owed once registered (the trainer's key, a Welcome), and how long the run has gone without a
rollout worker, and how many routes may register at once.

Invariant: at most one trainer and one publisher are registered, except while a run that waits for a
lost trainer (`trainer.on_loss = "wait"`) takes its successor; a worker may always register under a
name no one holds. A name is held by one route; it passes to another only by a registration that
shows the holder's proof (the same session on a new connection), or once no connection has the
holder's route (its process is gone: a restarted actor rejoins at once). A route is never taken from
a live peer by a claimant that merely presents its name. A registration from a route not registered
is taken only within `Registrations`' rate; one beyond it is deferred unanswered (its session sends it
again with its next heartbeat), so a flood of names costs the dispatcher the reads and nothing more.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from cadence.transport.zmq_socket import beyond_loopback
from cadence.wire.messages import Register, TrainerKey, Welcome
from cadence.wire.roles import REGISTERED

log = structlog.get_logger()


@dataclass
class Peer:
    name: str
    role: str
    address: str
    key: str = ""  # a trainer's: assignment tickets are made with it
    local: str = ""  # a publisher's ipc:// address, for workers on its host
    host: str = ""
    welcomed: bool = False
    told: str = ""  # a publisher's: the trainer key it was told
    proof: str = ""  # the session's secret it registered with
    pid: int = 0
    announced: int = -1  # a trainer's: the last version it announced


REGISTRATIONS_PER_S = 20.0
"""New registrations the dispatcher takes a second, once its burst is spent."""
REGISTRATIONS_BURST = 64
"""New registrations it takes at once (a run starting all its workers together)."""


class Registrations:
    """A token bucket over registrations from routes not yet registered: `burst` at once, then
    `per_s` a second; what is beyond is deferred (counted in `deferred`)."""

    def __init__(
        self,
        per_s: float = REGISTRATIONS_PER_S,
        burst: int = REGISTRATIONS_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_s = per_s
        self.burst = burst
        self.clock = clock
        self.deferred = 0
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        """Whether one more registration may be taken now (False: defer it, and it is counted)."""
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.deferred += 1
        return False


def joined(name: str, msg: Register) -> Peer:
    """The peer `msg` registers under `name` (its registration's checks passed), logged."""
    local = msg.local if msg.role == "publisher" else ""
    key = msg.key if msg.role == "trainer" else ""
    log.info(
        "peer_joined", peer=name, role=msg.role, address=msg.address, peer_pid=msg.pid, peer_host=msg.host
    )
    return Peer(
        name, msg.role, msg.address, key=key, local=local, host=msg.host, proof=msg.proof, pid=msg.pid
    )


def holding(peers: Mapping[bytes, Peer], name: str) -> tuple[bytes, Peer] | None:
    """The route and peer registered under `name`, if any."""
    return next(((k, p) for k, p in peers.items() if p.name == name), None)


def same_session(peer: Peer, msg: Register) -> bool:
    """Whether `msg` shows the proof `peer` registered with (an empty proof proves nothing)."""
    return bool(peer.proof) and hmac.compare_digest(peer.proof.encode(), msg.proof.encode())


def welcome_message(peers: Mapping[bytes, Peer], version: int) -> Welcome | None:
    """What a new worker is told once a trainer and a publisher are registered: their addresses,
    and the publisher's ipc:// one with the host it serves on (None before both are in)."""
    last = {p.role: p for p in peers.values() if p.role in ("trainer", "publisher")}
    trainer, publisher = last.get("trainer"), last.get("publisher")
    if trainer is None or publisher is None:
        return None
    if not (publisher.local and publisher.host):
        return Welcome(trainer.address, publisher.address, version)
    return Welcome(trainer.address, publisher.address, version, publisher.local, publisher.host)


def introductions(peers: Mapping[bytes, Peer], version: int) -> list[tuple[bytes, TrainerKey | Welcome]]:
    """What the roster owes its peers, each marked as told: the registered trainer's key to a publisher
    not yet told it, a Welcome to each rollout worker not yet welcomed (once both are in)."""
    welcome = welcome_message(peers, version)
    key = trainer_key(peers)
    owed: list[tuple[bytes, TrainerKey | Welcome]] = []
    for peer, info in peers.items():
        if info.role == "publisher" and key and info.told != key:
            info.told = key
            owed.append((peer, TrainerKey(key)))
    for peer, info in peers.items():
        if info.role == "rollout" and not info.welcomed and welcome is not None:
            info.welcomed = True
            owed.append((peer, welcome))
    return owed


def trainer_key(peers: Mapping[bytes, Peer]) -> str:
    """The registered trainer's key ("" while none is)."""
    return next((p.key for p in peers.values() if p.role == "trainer"), "")


def claim_problem(
    peers: Mapping[bytes, Peer],
    peer: bytes,
    name: str,
    msg: Register,
    waits_for_trainer: bool,
    reachable: Callable[[bytes], bool],
    secret: str = "",
) -> str | None:
    """Why `peer` may not register as `msg.role` under `name`, or None.

    A name held by another peer passes only to the same session (its proof), or once no connection
    has the holder's route (`reachable`: the restarted actor's old process is gone). A peer registers
    as a worker, or as the trainer or publisher when no other peer is that; with `waits_for_trainer`
    (`trainer.on_loss = "wait"`), while no trainer is registered, a new trainer's publisher also
    takes the place of the old one. A run with a `secret` gives the trainer's and publisher's roles
    only to a registration that shows it."""
    if msg.role not in REGISTERED:
        return f"role {msg.role!r} is none of {list(REGISTERED)}"
    if msg.role == "trainer" and not msg.key:
        return "a trainer registers with its key"
    if msg.local and not msg.local.startswith("ipc://"):
        return f"local address {msg.local[:80]!r} is not an ipc:// address"
    held = holding(peers, name)
    if held is not None and not same_session(held[1], msg) and (held[0] == peer or reachable(held[0])):
        route, holder = held
        where = f"pid {holder.pid} on {holder.host or 'an unnamed host'}"
        return (
            f"{name} is registered by a live {holder.role} session ({where}) and this registration does"
            " not show its proof; a name passes to another session once the holder's connection is gone"
        )
    if msg.role == "rollout":
        return unreachable_problem(peers, msg)
    holder_name = next((p.name for k, p in peers.items() if p.role == msg.role and p.name != name), None)
    trainer = any(p.role == "trainer" and p.name != name for p in peers.values())
    if holder_name is not None and not (waits_for_trainer and not trainer):
        return f"the run has its {msg.role} already ({holder_name})"
    if secret and not _shows(msg.secret, secret):
        return f"a {msg.role} registers with the run's secret (run.secret, beside config.json)"
    return None


def _shows(shown: str, secret: str) -> bool:
    return hmac.compare_digest(shown.encode(), secret.encode())


def _loopback(address: str) -> bool:
    """Whether `address` is reached from its own host alone (tcp on loopback, or a Unix socket)."""
    return address.startswith("ipc://") or (address.startswith("tcp://") and not beyond_loopback(address))


def unreachable_problem(peers: Mapping[bytes, Peer], msg: Register) -> str | None:
    """Why a worker registering from host `msg.host` cannot reach the trainer or publisher: one that
    serves at a loopback address on another host (`transport.host` left at its default)."""
    for peer in peers.values():
        elsewhere = bool(msg.host and peer.host and peer.host != msg.host)
        if peer.role in ("trainer", "publisher") and elsewhere and _loopback(peer.address):
            return (
                f"the {peer.role} serves at {peer.address} on host {peer.host}, which this worker on"
                f" {msg.host} cannot reach: start the {peer.role} with transport.host (or"
                f" transport.advertise_host) set to an address of {peer.host} that the workers reach"
            )
    return None


class WorkerWait:
    """How long work has waited with no rollout worker registered: said every 10 s, and a failure
    once `limit_s` has passed (`rollout.wait_for_workers_s`)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.since: float | None = None
        self.said = 0.0

    def check(
        self, workers: int, waiting: bool, now: float, period: int, pending: int, lost: Sequence[str]
    ) -> str | None:
        """`waiting`: prompts (training or eval) wait to be handed out; the failure message, or None."""
        if workers == 0 and waiting:
            self.since = self.since or now
            waited = now - self.since
            if waited >= self.limit_s:
                log.error("no_workers_left", period=period, waited_s=round(waited, 1), lost=list(lost))
                return (
                    f"no rollout worker left for {waited:.0f}s (rollout.wait_for_workers_s ="
                    f" {self.limit_s:g}) with {pending} prompts of period {period} pending;"
                    f" lost workers: {', '.join(lost) or 'none had joined'}"
                )
            if now - self.said >= 10.0:
                self.said = now
                log.warning(
                    "waiting_for_workers",
                    period=period,
                    pending=pending,
                    waited_s=round(waited, 1),
                    lost=list(lost),
                    fails_in_s=round(self.limit_s - waited, 1),
                )
        elif self.since is not None and workers:
            log.info("workers_back", workers=workers, waited_s=round(now - self.since, 1))
            self.since = None
            self.said = 0.0
        return None
