"""The authorisation table: every message type from every role to every actor, and the tickets."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from cadence.wire.messages import (
    REGISTRY,
    Consumed,
    Message,
    RunDone,
    VersionReady,
    decode_frames,
    encode_frames,
)
from cadence.wire.roles import (
    ACTORS,
    ROLES,
    SIGNED,
    assignment_ticket,
    may_send,
    new_key,
    sign,
    signed,
    unknown_tags,
    upload_ticket,
    valid_ticket,
)

MEMBERS = {"trainer", "publisher", "rollout"}
ANYONE = MEMBERS | {"stranger"}

# The contract, written out a second time by hand: (actor, tag) -> the roles that may send it.
EXPECTED: dict[tuple[str, str], set[str]] = {
    ("dispatcher", "register"): ANYONE,
    ("dispatcher", "heartbeat"): MEMBERS,
    ("dispatcher", "work_request"): {"rollout"},
    ("dispatcher", "eval_result"): {"rollout"},
    ("dispatcher", "consumed"): {"trainer"},
    ("dispatcher", "version_ready"): {"trainer"},
    ("dispatcher", "run_done"): {"trainer"},
    ("dispatcher", "log_batch"): MEMBERS,
    ("dispatcher", "subscribe"): ANYONE,
    ("trainer", "group_result"): {"rollout"},
    ("trainer", "heartbeat"): {"dispatcher"},
    ("trainer", "shutdown"): {"dispatcher"},
    ("publisher", "weight_upload"): {"trainer"},
    ("publisher", "weight_query"): ANYONE,
    ("publisher", "weight_chunk_request"): ANYONE,
    ("publisher", "broadcast_join"): ANYONE,
    ("publisher", "trainer_key"): {"dispatcher"},
    ("publisher", "heartbeat"): {"dispatcher"},
    ("publisher", "shutdown"): {"dispatcher"},
    ("rollout", "welcome"): {"dispatcher"},
    ("rollout", "assignment"): {"dispatcher"},
    ("rollout", "stop_period"): {"dispatcher"},
    ("rollout", "heartbeat"): {"dispatcher"},
    ("rollout", "shutdown"): {"dispatcher"},
    ("rollout", "weight_meta"): {"publisher"},
    ("rollout", "weight_chunk"): {"publisher"},
    ("rollout", "broadcast_joined"): {"publisher"},
    ("rollout", "broadcast_dropped"): {"publisher"},
    ("rollout", "broadcast_plan"): {"publisher"},
}


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_every_message_type_from_every_role_to_every_actor(tag: str) -> None:
    for actor, role in itertools.product(ACTORS, ROLES):
        allowed = role in EXPECTED.get((actor, tag), set())
        assert may_send(actor, role, tag) is allowed, (actor, role, tag)


def test_every_message_type_is_taken_by_some_actor_and_the_forged_ones_only_from_their_owner() -> None:
    assert unknown_tags() == set()
    assert {tag for _, tag in EXPECTED} == set(REGISTRY)
    # the rules a run depends on: only the trainer ends the run, announces versions, uploads weights
    for tag, actor in (
        ("run_done", "dispatcher"),
        ("version_ready", "dispatcher"),
        ("weight_upload", "publisher"),
    ):
        assert [r for r in ROLES if may_send(actor, r, tag)] == ["trainer"]
    assert [r for r in ROLES if may_send("trainer", r, "group_result")] == ["rollout"]
    # an eval answer goes to the dispatcher only: no role may bring one to the trainer, so none is trained
    assert [a for a in ACTORS if any(may_send(a, r, "eval_result") for r in ROLES)] == ["dispatcher"]
    assert not may_send("nobody", "trainer", "run_done") and not may_send("dispatcher", "trainer", "nonsense")


def test_a_ticket_proves_exactly_what_it_was_made_for() -> None:
    key = new_key()
    assert key != new_key() and len(key) == 32
    shown = assignment_ticket(key, 3, 17, "rollout-0")
    assert valid_ticket(key, shown, "assignment", 3, 17, "rollout-0")
    for period, prompt, worker in ((4, 17, "rollout-0"), (3, 18, "rollout-0"), (3, 17, "rollout-1")):
        assert not valid_ticket(key, shown, "assignment", period, prompt, worker)
    assert not valid_ticket(new_key(), shown, "assignment", 3, 17, "rollout-0")  # another trainer's key
    assert not valid_ticket("", assignment_ticket("", 3, 17, "rollout-0"), "assignment", 3, 17, "rollout-0")
    upload = upload_ticket(key, 2, 5, "ab" * 16)
    assert valid_ticket(key, upload, "upload", 2, 5, "ab" * 16)
    assert not valid_ticket(key, upload, "upload", 2, 6, "ab" * 16)
    assert not valid_ticket(key, shown, "upload", 3, 17, "rollout-0")  # an assignment is no upload
    assert not valid_ticket(key, "", "assignment", 3, 17, "rollout-0")


def _on_the_wire(msg: Message) -> Message:
    """What the dispatcher decodes of what the trainer sent."""
    return decode_frames(encode_frames(msg, "trainer", "run")).message


@pytest.mark.parametrize(
    "msg",
    [
        VersionReady(
            3, "d" * 32, 1 << 20, {"period": 2, "reward_mean": 0.1 + 0.2, "spans": [[1.5, 2.0]], "x": None}
        ),
        VersionReady(0, "d" * 32, 10),
        RunDone(5, "s" * 64, "/runs/a/checkpoints/final"),
        Consumed(4, [7, 1, 3]),
    ],
)
def test_the_trainers_word_is_signed_field_by_field(msg: VersionReady | RunDone | Consumed) -> None:
    key = new_key()
    assert msg.TAG in SIGNED
    good = sign(key, msg)
    assert signed(key, _on_the_wire(good))  # a msgpack round trip keeps the MAC valid
    assert not signed(key, msg) and not signed(new_key(), good) and not signed("", good)
    for name, value in msgspec.structs.asdict(good).items():  # any field changed: no longer signed
        if name == "mac":
            continue
        changed: Any = (
            value + 1
            if isinstance(value, int)
            else value + "x"
            if isinstance(value, str)
            else [*value, 9]
            if isinstance(value, list)
            else {**value, "forged": 1}
        )
        assert not signed(key, msgspec.structs.replace(good, **{name: changed})), name
    flipped = good.mac[:-1] + ("0" if good.mac[-1] != "0" else "1")
    assert not signed(key, msgspec.structs.replace(good, mac=flipped))
