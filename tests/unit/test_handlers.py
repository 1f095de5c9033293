"""Every actor's handler tables cover exactly what `wire/roles.py` lets it take."""

from __future__ import annotations

import pytest

from cadence.actors.dispatcher import Dispatcher
from cadence.actors.publisher import Publisher
from cadence.actors.rollout import RolloutWorker
from cadence.actors.trainer import Trainer
from cadence.transport.session import Session
from cadence.wire.messages import Message
from cadence.wire.roles import ACTORS, AUTHORISED


def tags(*tables: object) -> set[str]:
    kinds: list[type[Message]] = [k for table in tables for k in table]  # type: ignore[attr-defined]
    return {k.TAG for k in kinds}


TAKEN = {
    "dispatcher": tags(Dispatcher.HANDLERS),
    "trainer": tags(Trainer.CHECKS, Trainer.SESSION_HANDLERS, Session.TAKES),
    "publisher": tags(Publisher.HANDLERS, Publisher.SESSION_HANDLERS, Session.TAKES),
    "rollout": tags(RolloutWorker.SESSION_HANDLERS, RolloutWorker.FROM_PUBLISHER, Session.TAKES),
}


@pytest.mark.parametrize("actor", ACTORS)
def test_an_actors_tables_take_what_the_roles_table_allows_it(actor: str) -> None:
    allowed = set(AUTHORISED[actor])
    assert TAKEN[actor] == allowed, (
        f"{actor}: handled but not authorised {sorted(TAKEN[actor] - allowed)},"
        f" authorised but not handled {sorted(allowed - TAKEN[actor])}"
    )


def test_every_table_holds_message_types() -> None:
    for table in (Dispatcher.HANDLERS, Publisher.HANDLERS, Trainer.CHECKS, RolloutWorker.SESSION_HANDLERS):
        assert all(isinstance(k, type) and issubclass(k, Message) for k in table)
