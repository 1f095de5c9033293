"""The checks every message passes at the dispatcher before its handler acts on it.

Invariant: a message is acted on only when its route registered under the name it gives (or it is a
`Register`), its sender's role may send it (`cadence.wire.roles`), a claim to a name or role holds
(`roster.claim_problem`), it makes sense now (`cadence.wire.meaning`), and the trainer's word
carries the trainer's MAC (`roles.SIGNED`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cadence.dispatch.core import DispatchCore
from cadence.dispatch.roster import Peer, claim_problem
from cadence.dispatch.settings import DispatcherSettings
from cadence.wire.meaning import (
    consumed_problem,
    eval_result_problem,
    run_done_problem,
    version_ready_problem,
    work_request_problem,
)
from cadence.wire.messages import (
    Consumed,
    EvalResult,
    LogBatch,
    Message,
    Register,
    RunDone,
    VersionReady,
    WorkRequest,
)
from cadence.wire.roles import SIGNED, may_send, signed


def message_problem(
    peers: Mapping[bytes, Peer],
    peer: bytes,
    sender: str,
    role: str,
    msg: Message,
    settings: DispatcherSettings,
    core: DispatchCore,
    reachable: Callable[[bytes], bool],
) -> str | None:
    """Why `sender`, on route `peer`, as `role`, may not send `msg` now, or None. `reachable`: whether
    a route still has a connection (the server's)."""
    known = peers.get(peer)
    if known is not None and known.name != sender:
        return f"sent as {sender!r} from the route {known.name!r} registered from"
    if not may_send("dispatcher", role, msg.TAG):
        return f"a {role} may not send {msg.TAG} to the dispatcher"
    if isinstance(msg, Register):
        waits = settings.on_trainer_loss == "wait"
        return claim_problem(peers, peer, sender, msg, waits, reachable, settings.run_secret)
    if known is None:
        return "its route never registered"
    problem = _meaning(known, peer, msg, settings, core)
    if problem is None and msg.TAG in SIGNED and not signed(known.key, msg):
        return f"no MAC of the registered trainer's key on {msg.TAG}"
    return problem


def _meaning(
    known: Peer, peer: bytes, msg: Message, settings: DispatcherSettings, core: DispatchCore
) -> str | None:
    """What the message must also mean (`cadence.wire.meaning`)."""
    if isinstance(msg, VersionReady):
        return version_ready_problem(msg, settings.periods, core.published, first=known.announced < 0)
    if isinstance(msg, RunDone):
        return run_done_problem(msg, settings.periods, known.announced)
    if isinstance(msg, WorkRequest):
        return work_request_problem(msg)
    if isinstance(msg, Consumed):
        return consumed_problem(msg, core.period)
    if isinstance(msg, EvalResult):
        return eval_result_problem(msg, settings.eval_samples) or core.eval_problem(peer, msg)
    if isinstance(msg, LogBatch) and msg.actor != known.name:
        return f"log lines under the name {msg.actor[:100]!r}: a peer logs under its own name only"
    return None
