"""Who may say what: the roles of a run's peers, the one table of which role may send which message
to which actor, and the tickets that prove a role where no registration can be looked up.

Invariant: an actor takes a message only when `may_send(actor, role, tag)` holds for the role the
sender has (see below); everything else is refused and logged, never handled. This module imports
nothing of cadence but the messages.

A peer's role is:
- at the dispatcher, the role it registered with (`Register.role`), kept by the route it registered
  from; "stranger" before it has (a `cadence logs` follower never registers); the
  trainer's word (`SIGNED`) must also carry a MAC under the key it registered with (`sign`);
- at the trainer, "rollout" for a `GroupResult` that carries the dispatcher's ticket for that
  (period, prompt id) and that worker: the dispatcher makes it with the key the trainer registered
  with, so only a worker the dispatcher assigned that prompt to this period can show it;
- at the publisher, "trainer" for a `WeightUpload` whose ticket was made with the registered
  trainer's key, which the dispatcher tells the publisher (`TrainerKey`);
- at a client (a rollout worker, or an actor's session), the role of the server it connected to.

Without CURVE keys (`cadence keys`) a key travels in the clear: the tickets keep out a peer that
knows the run id, not one that reads the network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import TypeVar

import msgspec

from cadence.wire.messages import REGISTRY, Message

S = TypeVar("S", bound=Message)

ROLES = ("dispatcher", "trainer", "publisher", "rollout", "stranger")
"""Every role a sender can have; "stranger": a peer that has not registered or proved a role."""

REGISTERED = ("trainer", "publisher", "rollout")
"""The roles a peer may register with."""

ACTORS = ("dispatcher", "trainer", "publisher", "rollout")
"""The actors that receive messages (the trainer and publisher also on their sessions)."""

_ANYONE = frozenset(ROLES) - {"dispatcher"}
_MEMBERS = frozenset(REGISTERED)

AUTHORISED: dict[str, dict[str, frozenset[str]]] = {
    "dispatcher": {
        "register": _ANYONE,  # a claim to the trainer's or publisher's role is checked beside this
        "heartbeat": _MEMBERS,
        "work_request": frozenset({"rollout"}),
        "eval_result": frozenset({"rollout"}),  # and only for an eval prompt the dispatcher gave that worker
        "consumed": frozenset({"trainer"}),
        "version_ready": frozenset({"trainer"}),
        "run_done": frozenset({"trainer"}),
        "log_batch": _MEMBERS,  # on the actor's own session, under its own name (`dispatch.checks`)
        "subscribe": _ANYONE,  # `cadence logs` followers
    },
    "trainer": {  # its server; on its session, what every session takes
        "group_result": frozenset({"rollout"}),
        "heartbeat": frozenset({"dispatcher"}),
        "shutdown": frozenset({"dispatcher"}),
    },
    "publisher": {
        "weight_upload": frozenset({"trainer"}),
        "weight_query": _ANYONE,
        "weight_chunk_request": _ANYONE,
        "broadcast_join": _ANYONE,
        "trainer_key": frozenset({"dispatcher"}),
        "heartbeat": frozenset({"dispatcher"}),
        "shutdown": frozenset({"dispatcher"}),
    },
    "rollout": {
        "welcome": frozenset({"dispatcher"}),
        "assignment": frozenset({"dispatcher"}),
        "stop_period": frozenset({"dispatcher"}),
        "heartbeat": frozenset({"dispatcher"}),
        "shutdown": frozenset({"dispatcher"}),
        "weight_meta": frozenset({"publisher"}),
        "weight_chunk": frozenset({"publisher"}),
        "broadcast_joined": frozenset({"publisher"}),
        "broadcast_dropped": frozenset({"publisher"}),
        "broadcast_plan": frozenset({"publisher"}),
    },
}


def may_send(actor: str, role: str, tag: str) -> bool:
    """Whether a peer of `role` may send a message tagged `tag` to `actor`."""
    return role in AUTHORISED.get(actor, {}).get(tag, frozenset())


def unknown_tags() -> set[str]:
    """Message types no actor takes from anyone (none, when the table is complete)."""
    taken = {tag for table in AUTHORISED.values() for tag in table}
    return set(REGISTRY) - taken


def new_key() -> str:
    """A fresh random key for tickets (hex)."""
    return secrets.token_hex(16)


def ticket(key: str, *parts: object) -> str:
    """The proof, made with `key`, that whoever holds `key` vouches for `parts` (an HMAC-SHA256, hex)."""
    text = ":".join(str(p) for p in parts).encode()
    return hmac.new(key.encode(), text, hashlib.sha256).hexdigest()[:32]


def valid_ticket(key: str, shown: str, *parts: object) -> bool:
    """Whether `shown` is the ticket of `parts` under `key` (an empty key vouches for nothing)."""
    return bool(key) and hmac.compare_digest(shown.encode(), ticket(key, *parts).encode())


SIGNED = frozenset({"consumed", "version_ready", "run_done"})
"""The trainer's word to the dispatcher: each carries a MAC (`mac`) under the trainer's key, checked
before the dispatcher acts on it."""


def _signed_text(msg: Message) -> str:
    """Every field of `msg` but its MAC, as one canonical text (sorted keys, floats as Python writes
    them: the same on both sides of a msgpack round trip)."""
    fields = msgspec.structs.asdict(msg)
    fields.pop("mac", None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=repr)


def sign(key: str, msg: S) -> S:
    """`msg` with its MAC under `key` (a message of `SIGNED`)."""
    return msgspec.structs.replace(msg, mac=ticket(key, msg.TAG, _signed_text(msg)))


def signed(key: str, msg: Message) -> bool:
    """Whether `msg` carries the MAC of its fields under `key`."""
    return valid_ticket(key, getattr(msg, "mac", ""), msg.TAG, _signed_text(msg))


def assignment_ticket(key: str, period: int, prompt_id: int, worker: str) -> str:
    """The ticket of prompt `prompt_id` of `period` assigned to `worker` (by its actor name)."""
    return ticket(key, "assignment", period, prompt_id, worker)


def upload_ticket(key: str, version: int, chunks: int, digest: str) -> str:
    """The ticket of the trainer's upload of `version` in `chunks` chunks, whose bytes have `digest`."""
    return ticket(key, "upload", version, chunks, digest)
