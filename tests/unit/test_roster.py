"""What the dispatcher tells a new worker, and where the worker pulls versions from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cadence.actors.rollout_weights import pull_address
from cadence.dispatch.roster import Peer, claim_problem, welcome_message
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


def connected(*routes: bytes) -> Callable[[bytes], bool]:
    """Which routes still have a connection, as the dispatcher's server would say."""
    return lambda route: route in routes


def test_a_local_address_other_than_ipc_is_refused_at_registration() -> None:
    bad = Register("publisher", "tcp://a:2", 1, "a", "", "tcp://elsewhere:5")
    problem = claim_problem({}, b"p", "publisher", bad, False, connected())
    assert problem == "local address 'tcp://elsewhere:5' is not an ipc:// address"
    good = Register("publisher", "tcp://a:2", 1, "a", "", PUBLISHER.local)
    assert claim_problem({}, b"p", "publisher", good, False, connected()) is None


WORKER = Peer("rollout-0", "rollout", "", proof="proof-of-rollout-0", pid=41, host="b")
PEERS = {b"trainer#1": TRAINER, b"rollout-0#1": WORKER}


@pytest.mark.parametrize(
    ("route", "proof", "live", "refused"),
    [
        (b"rollout-0", "", (b"rollout-0#1",), True),  # its name, from another route: the route stays
        (b"rollout-0", "a-guess", (b"rollout-0#1",), True),
        (b"rollout-0#1", "a-guess", (b"rollout-0#1",), True),  # its very route, without its proof
        (b"rollout-0#2", "proof-of-rollout-0", (b"rollout-0#1",), False),  # the same session, reconnected
        (b"rollout-0#2", "another-session", (), False),  # the old process is gone: a restart rejoins
    ],
)
def test_a_name_passes_only_with_its_proof_or_once_its_connection_is_gone(
    route: bytes, proof: str, live: tuple[bytes, ...], refused: bool
) -> None:
    claim = Register("rollout", "", 7, "x", proof=proof)
    problem = claim_problem(PEERS, route, "rollout-0", claim, False, connected(*live))
    assert (problem is not None) == refused, problem
    if refused:
        assert (
            problem is not None
            and "rollout-0 is registered by a live rollout session (pid 41 on b)" in problem
        )


def test_a_trainer_is_taken_over_by_no_claim_while_it_lives() -> None:
    impostor = Register("trainer", "tcp://evil:1", 7, "x", key="k2")
    live = connected(b"trainer#1")
    assert "registered by a live trainer session" in str(
        claim_problem(PEERS, b"trainer", "trainer", impostor, True, live)
    )
    assert (
        claim_problem(PEERS, b"x", "other", impostor, False, live)
        == "the run has its trainer already (trainer)"
    )
    # its process gone, a restarted trainer takes the name back (and the dispatcher loses the old one)
    assert claim_problem(PEERS, b"trainer#2", "trainer", impostor, False, connected()) is None


def test_a_worker_on_another_host_is_told_it_cannot_reach_a_loopback_trainer() -> None:
    trainer = Peer("trainer", "trainer", "tcp://127.0.0.1:5601", key="k", host="n1")
    publisher = Peer("publisher", "publisher", "tcp://10.0.0.1:5602", host="n1")
    peers = {b"t": trainer, b"p": publisher}
    far = Register("rollout", "", 7, "n2")
    problem = claim_problem(peers, b"w", "rollout-0", far, False, connected())
    assert problem is not None and "the trainer serves at tcp://127.0.0.1:5601 on host n1" in problem
    assert "transport.host" in problem
    near = Register("rollout", "", 7, "n1")  # the same host reaches its loopback
    assert claim_problem(peers, b"w", "rollout-0", near, False, connected()) is None
    reachable = {b"t": Peer("trainer", "trainer", "tcp://10.0.0.1:5601", key="k", host="n1"), b"p": publisher}
    assert claim_problem(reachable, b"w", "rollout-0", far, False, connected()) is None


def test_with_a_run_secret_the_trainers_and_publishers_roles_go_only_to_who_shows_it() -> None:
    first = Register("trainer", "tcp://evil:1", 7, "x", key="k2")  # first come, no secret
    shown = Register("trainer", "tcp://a:1", 8, "a", key="k3", secret="s3cret")
    assert claim_problem({}, b"x", "trainer", first, False, connected(), "s3cret") == (
        "a trainer registers with the run's secret (run.secret, beside config.json)"
    )
    wrong = Register("publisher", "tcp://evil:2", secret="guess")
    assert "a publisher registers with the run's secret" in str(
        claim_problem({}, b"y", "publisher", wrong, False, connected(), "s3cret")
    )
    assert claim_problem({}, b"t", "trainer", shown, False, connected(), "s3cret") is None
    assert claim_problem({}, b"x", "trainer", first, False, connected()) is None  # no run secret: first come
    worker = Register("rollout", "", 9, "b")  # workers show none
    assert claim_problem({}, b"w", "w0", worker, False, connected(), "s3cret") is None


def test_the_run_secret_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    from cadence.launch.secret import SECRET_FILE, make_run_secret, read_run_secret

    assert read_run_secret(tmp_path) == ""
    made = make_run_secret(tmp_path)
    assert len(made) == 32 and read_run_secret(tmp_path) == made == make_run_secret(tmp_path)
    assert (tmp_path / SECRET_FILE).stat().st_mode & 0o777 == 0o600


def test_registrations_are_taken_in_a_burst_then_at_their_rate() -> None:
    from cadence.dispatch.roster import Registrations

    now = [0.0]
    bucket = Registrations(per_s=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(5)] == [True, True, True, False, False]
    now[0] = 1.0  # two more a second
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 100.0  # never more than the burst saved up
    assert sum(bucket.take() for _ in range(10)) == 3 and bucket.deferred == 3 + 7
