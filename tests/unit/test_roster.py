"""What the dispatcher tells a new worker, and where the worker pulls versions from."""

from __future__ import annotations

from cadence.actors.rollout import pull_address
from cadence.actors.roster import Peer, claim_problem, welcome_message
from cadence.wire.messages import Register, Welcome

TRAINER = Peer("trainer", "trainer", "tcp://a:1", key="k")
PUBLISHER = Peer("publisher", "publisher", "tcp://a:2", local="ipc:///tmp/cadence-x/publisher.sock", host="a")


def test_a_worker_is_welcomed_once_a_trainer_and_a_publisher_are_in() -> None:
    assert welcome_message({b"t": TRAINER}, 3) is None
    assert welcome_message({b"t": TRAINER, b"p": PUBLISHER}, 3) == Welcome(
        "tcp://a:1", "tcp://a:2", 3, "ipc:///tmp/cadence-x/publisher.sock", "a"
    )
    remote = Peer("publisher", "publisher", "tcp://b:2")  # serves no ipc:// address
    assert welcome_message({b"t": TRAINER, b"p": remote}, 0) == Welcome("tcp://a:1", "tcp://b:2", 0)


def test_a_worker_pulls_through_the_unix_socket_only_on_the_publishers_host() -> None:
    welcome = Welcome("tcp://a:1", "tcp://a:2", 0, "ipc:///tmp/cadence-x/publisher.sock", "a")
    assert pull_address(welcome, "a") == "ipc:///tmp/cadence-x/publisher.sock"
    assert pull_address(welcome, "b") == "tcp://a:2"
    assert pull_address(welcome, "") == "tcp://a:2"
    assert pull_address(Welcome("tcp://a:1", "tcp://a:2", 0, "tcp://a:9", "a"), "a") == "tcp://a:2"


def test_a_local_address_other_than_ipc_is_refused_at_registration() -> None:
    bad = Register("publisher", "tcp://a:2", 1, "a", "", "tcp://elsewhere:5")
    assert claim_problem({}, b"p", bad, False) == "local address 'tcp://elsewhere:5' is not an ipc:// address"
    assert (
        claim_problem({}, b"p", Register("publisher", "tcp://a:2", 1, "a", "", PUBLISHER.local), False)
        is None
    )
