"""Liveness on a fake clock: who was heard from, who is dead, and that each is declared dead once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cadence.transport.heartbeat import Liveness


def fake_clock(start: float = 100.0) -> tuple[list[float], Callable[[], float]]:
    """A clock that reads `now[0]`; the test moves time by assigning to it."""
    now = [start]
    return now, lambda: now[0]


def test_timeout_is_interval_times_liveness() -> None:
    _, clock = fake_clock()
    assert Liveness(0.5, 20, clock).timeout_s == pytest.approx(10.0)
    assert Liveness(2.0, 3, clock).timeout_s == pytest.approx(6.0)


def test_seen_says_whether_the_peer_is_new() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    assert live.seen("w1") is True
    now[0] += 1.0
    assert live.seen("w1") is False
    assert live.seen("w2") is True
    assert live.last_seen == {"w1": 101.0, "w2": 101.0}


def test_a_peer_is_alive_up_to_the_timeout_and_dead_after_it() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    live.seen("w1")
    now[0] = 103.0  # exactly the timeout: not yet
    assert live.expired() == []
    now[0] = 103.25
    assert live.expired() == [("w1", pytest.approx(3.25))]


def test_hearing_from_a_peer_resets_its_timer() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    live.seen("w1")
    live.seen("w2")
    now[0] = 102.5
    live.seen("w1")
    now[0] = 104.0
    assert live.expired() == [("w2", pytest.approx(4.0))]
    now[0] = 105.0
    assert live.expired() == []  # w1 silent for 2.5 s only
    now[0] = 105.75
    assert live.expired() == [("w1", pytest.approx(3.25))]


def test_a_dead_peer_is_declared_once_and_forgotten() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    live.seen("w1")
    now[0] = 110.0
    assert [p for p, _ in live.expired()] == ["w1"]
    assert live.expired() == []
    now[0] = 200.0
    assert live.expired() == []
    assert "w1" not in live.last_seen


def test_a_dead_peer_heard_again_is_new() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    live.seen("w1")
    now[0] = 110.0
    live.expired()
    assert live.seen("w1") is True
    now[0] = 112.0
    assert live.expired() == []
    now[0] = 113.5
    assert live.expired() == [("w1", pytest.approx(3.5))]


def test_forget_removes_a_peer_and_ignores_unknown_ones() -> None:
    now, clock = fake_clock()
    live = Liveness(1.0, 3, clock)
    live.seen("w1")
    live.seen("w2")
    live.forget("w1")
    live.forget("never-seen")
    now[0] = 150.0
    assert live.expired() == [("w2", pytest.approx(50.0))]
    assert live.seen("w1") is True


def test_several_peers_expire_together_with_their_silences() -> None:
    now, clock = fake_clock(0.0)
    live = Liveness(0.5, 4, clock)
    live.seen("a")
    now[0] = 1.0
    live.seen("b")
    now[0] = 1.5
    live.seen("c")
    now[0] = 3.25
    assert sorted(live.expired()) == [("a", pytest.approx(3.25)), ("b", pytest.approx(2.25))]
    assert list(live.last_seen) == ["c"]
