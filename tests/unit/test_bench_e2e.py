"""`cadence bench e2e`'s arithmetic on made-up metrics rows: a single-turn row gives exactly its figures,
an episode row adds the environment's beside generation and training, and which part bounds the period."""

from __future__ import annotations

from typing import Any

import pytest

from cadence.bench.e2e import WARMUP, bound, measure, period_figures

SINGLE_TURN = {
    "period_s",
    "trainer_idle_s",
    "trainer_idle_total_s",
    "train_s",
    "step_s",
    "publish_s",
    "load_s",
    "gen_s",
    "micro_batches",
    "tokens_trained",
    "tokens_kept",
    "tokens_computed",
    "tokens_generated",
    "generated_per_s",
    "trained_per_s",
}


def _row(period: int, gen_s: float, train_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "period": period,
        "period_s": gen_s + 1.0,
        "group_arrival_s": [0.5, gen_s],
        "trainer_idle_s": 0.5,
        "forward_backward_s": train_s,
        "step_s": 0.25,
        "publish_s": 0.125,
        "weight_load_s": 0.0625,
        "gen_s": gen_s,
        "micro_batches": 2,
        "tokens_trained": 100,
        "tokens_kept": 110,
        "tokens_computed": 120,
        "tokens_generated": 150,
        **extra,
    }


def _episodes(period: int, gen_s: float, train_s: float) -> dict[str, Any]:
    return _row(period, gen_s, train_s, turns_mean=2.5, env_s=6.0, env_tokens=40, ended_done=8)


def test_a_single_turn_row_gives_exactly_the_single_turn_figures() -> None:
    figures = period_figures(_row(3, 4.0, 2.0), env_wait_s=9.0)  # no episodes: a wait is not shown
    assert set(figures) == SINGLE_TURN
    assert (figures["gen_s"], figures["train_s"], figures["trainer_idle_s"]) == (4.0, 2.0, 0.5)
    assert (figures["generated_per_s"], figures["trained_per_s"]) == (150 / 5.0, 100 / 5.0)


def test_an_episode_row_puts_the_environment_beside_generation_and_training() -> None:
    figures = period_figures(_episodes(3, 4.0, 2.0), env_wait_s=1.5)
    assert set(figures) == SINGLE_TURN | {"env_wait_s", "gen_model_s", "env_s", "turns_mean"}
    assert (figures["env_wait_s"], figures["gen_model_s"], figures["env_s"]) == (1.5, 2.5, 6.0)
    assert figures["turns_mean"] == 2.5


def test_measure_takes_each_periods_own_wait_after_the_warm_up() -> None:
    rows = [_episodes(k, 4.0, 2.0) for k in range(WARMUP + 2)]
    waits = {0: 100.0, 1: 100.0, WARMUP: 1.0, WARMUP + 1: 2.0}  # the warm-up periods' are left out
    figures = measure(rows, waits)
    assert (figures["env_wait_s"], figures["gen_model_s"], figures["gen_s"]) == (1.5, 2.5, 4.0)
    assert measure(rows)["env_wait_s"] == 0.0  # no spans: no wait seen
    assert set(measure([_row(k, 4.0, 2.0) for k in range(WARMUP + 1)], waits)) == SINGLE_TURN


@pytest.mark.parametrize(
    ("gen_s", "wait", "train_s", "part"),
    [(4.0, 1.0, 2.0, "generation"), (4.0, 3.0, 0.5, "environment"), (2.0, 0.5, 3.0, "training")],
)
def test_the_bound_is_the_longest_part(gen_s: float, wait: float, train_s: float, part: str) -> None:
    assert bound(period_figures(_episodes(2, gen_s, train_s), env_wait_s=wait)) == part
