"""Thread budgets: automatic shares of the host's cores, explicit settings kept, bad values named."""

from __future__ import annotations

import pytest

from cadence.config import ConfigError, load_config
from cadence.launch.threads import (
    SPIN_COUNT,
    host_cores,
    openmp_waits,
    rollout_threads,
    rollout_threads_alone,
    trainer_threads,
    wait_as_launched,
)


@pytest.mark.parametrize(
    ("cores", "workers", "ranks", "rollout", "periodic", "sync"),
    [
        (2, 1, 1, 1, 1, 2),
        (2, 2, 1, 1, 1, 2),
        (16, 3, 1, 4, 4, 16),
        (16, 2, 2, 4, 4, 8),
        (17, 2, 1, 5, 7, 17),
        (1, 4, 1, 1, 1, 1),
    ],
)
def test_automatic_budgets_share_the_cores(
    cores: int, workers: int, ranks: int, rollout: int, periodic: int, sync: int
) -> None:
    """A worker's share is the same in both modes; a periodic trainer never adds threads beyond the
    cores while the workers compute, a sync one takes them all."""
    for mode, trainer in (("periodic", periodic), ("sync", sync)):
        overrides = [f"rollout.workers={workers}", f"trainer.ranks={ranks}", f"mode='{mode}'"]
        cfg = load_config(None, overrides)
        assert rollout_threads(cfg, cores) == rollout
        assert trainer_threads(cfg, cores) == trainer
        if mode == "periodic" and workers * rollout < cores:
            assert workers * rollout + ranks * trainer <= cores


@pytest.mark.parametrize(
    ("cores", "workers", "ranks", "alone"),
    [(2, 1, 1, 2), (2, 2, 1, 1), (16, 3, 1, 5), (16, 2, 2, 8), (1, 4, 1, 1)],
)
def test_workers_may_take_the_cores_a_waiting_trainer_leaves(
    cores: int, workers: int, ranks: int, alone: int
) -> None:
    """While the trainer waits (sync mode: all the while the workers generate; periodic: when its
    activity says so) the workers may share every core, in both modes alike."""
    for mode in ("sync", "periodic"):
        cfg = load_config(None, [f"rollout.workers={workers}", f"trainer.ranks={ranks}", f"mode='{mode}'"])
        assert rollout_threads_alone(cfg, cores) == alone >= rollout_threads(cfg, cores)


def test_explicit_budgets_are_kept_whatever_the_host() -> None:
    cfg = load_config(None, ["rollout.threads=3", "trainer.threads=5"])
    assert rollout_threads(cfg, 64) == 3 and rollout_threads(cfg) == 3
    sync = load_config(None, ["rollout.threads=3", "mode='sync'"])
    assert rollout_threads_alone(sync, 64) == 3
    assert trainer_threads(cfg, 1) == 5 and trainer_threads(cfg) == 5
    assert host_cores() >= 1


@pytest.mark.parametrize("key", ["rollout.threads", "trainer.threads"])
def test_a_negative_budget_is_named(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(None, [f"{key}=-1"])


def test_every_actor_waits_passively_after_a_short_spin_unless_the_user_says_otherwise() -> None:
    assert openmp_waits({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(SPIN_COUNT)}
    assert 0 < SPIN_COUNT < 300_000  # briefer than GNU OpenMP's default spin, longer than none
    mine = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0", "OTHER": "x"}
    assert openmp_waits(mine) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}
    assert openmp_waits({"GOMP_SPINCOUNT": "5"})["OMP_WAIT_POLICY"] == "PASSIVE"


def test_an_actor_started_by_hand_waits_as_a_launched_one_unless_torch_is_loaded() -> None:
    environ = {"GOMP_SPINCOUNT": "7"}
    assert wait_as_launched(environ, {}) is True
    assert environ == {"GOMP_SPINCOUNT": "7", "OMP_WAIT_POLICY": "PASSIVE"}
    late: dict[str, str] = {}
    assert wait_as_launched(late, {"torch": object()}) is False and late == {}
