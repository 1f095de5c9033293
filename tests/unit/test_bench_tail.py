"""`cadence bench tail`'s arithmetic on made-up metrics rows: the variants' overrides, the alternated
order of the runs, the means after the warm-up period, the reward a second, and the arrival bias of
an `@prompt` twin."""

from __future__ import annotations

from typing import Any

import pytest

from cadence.bench.pipeline import ideal_period
from cadence.bench.tail import (
    DEFAULT_VARIANTS,
    WARMUP,
    arrival_bias,
    kept,
    measure,
    parse_variants,
    period_figures,
    schedule,
    speedups,
    twin,
    variant_overrides,
)
from cadence.config import ConfigError, load_config

G = 4  # samples a group


def _row(period: int, period_s: float, groups: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "period": period,
        "period_s": period_s,
        "trainer_idle_s": 0.5,
        "tail_s": 0.25,
        "gen_s": period_s - 1.0,
        "groups": groups,
        "reward_mean": 0.5,
        "response_len_mean": 12.0,
        "tokens_kept": 10 * groups * G,  # kept samples of 10 tokens
        "tokens_generated": 100,
        **extra,
    }


def _sampled(period: int, period_s: float, reward_kept: float, tokens_each: int) -> dict[str, Any]:
    """An over-sampled row: 2 kept groups of 4 samples, `tokens_each` tokens a kept sample."""
    row = _row(period, period_s, prompts_issued=3, groups_filtered=1, groups_stopped=0)
    return row | {"reward_kept_mean": reward_kept, "tokens_kept": tokens_each * 2 * G}


def test_the_variants_set_the_whole_sampling_section_and_nothing_else() -> None:
    assert variant_overrides("base") == [
        "sampling.oversample=0.0",
        "sampling.filters=[]",
        "sampling.order='arrival'",
    ]
    assert variant_overrides("over50+zv@prompt") == [
        "sampling.oversample=0.5",
        "sampling.filters=['zero_variance']",
        "sampling.order='prompt'",
    ]
    assert variant_overrides("over25+rr+zv")[1] == "sampling.filters=['reward_range', 'zero_variance']"
    for name in DEFAULT_VARIANTS:  # each a config that loads
        cfg = load_config(None, variant_overrides(name))
        assert cfg.sampling.on == (name != "base")
    assert load_config(None, variant_overrides("over50+zv@prompt")).sampling.order == "prompt"


@pytest.mark.parametrize("name", ["over", "over25+xx", "over25@fast", "fast"])
def test_a_variant_that_does_not_parse_is_named(name: str) -> None:
    with pytest.raises(ConfigError, match=name.replace("+", r"\+")):
        variant_overrides(name)


def test_variants_default_to_the_list_and_must_be_named_once() -> None:
    assert parse_variants(None) == list(DEFAULT_VARIANTS)
    assert parse_variants(" base, over25 ") == ["base", "over25"]
    with pytest.raises(ConfigError, match="once"):
        parse_variants("base,base")


def test_rounds_alternate_the_order_of_the_variants() -> None:
    assert schedule(["a", "b", "c"], 3) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c"),
    ]  # fmt: skip


def test_a_row_without_sampling_trained_every_group_it_issued() -> None:
    figures = period_figures(_row(1, 4.0), G)
    assert (figures["prompts_issued"], figures["groups_filtered"], figures["groups_stopped"]) == (2, 0, 0)
    assert figures["reward_kept_mean"] == figures["reward_mean"] == 0.5
    assert figures["response_len_kept"] == 10.0 and figures["response_len_mean"] == 12.0
    assert figures["reward_trained"] == 0.5 * 2 * G


def test_an_over_sampled_row_gives_its_kept_groups_figures() -> None:
    figures = period_figures(_sampled(1, 4.0, reward_kept=0.75, tokens_each=6), G)
    assert (figures["prompts_issued"], figures["groups_filtered"]) == (3, 1)
    assert (figures["reward_kept_mean"], figures["reward_mean"]) == (0.75, 0.5)
    assert figures["response_len_kept"] == 6.0
    assert figures["reward_trained"] == 0.75 * 2 * G


def test_measure_leaves_out_each_runs_warm_up_and_pools_the_rounds() -> None:
    first = [_row(0, 100.0), _row(1, 4.0), _row(2, 6.0)]
    second = [_row(0, 100.0), _row(1, 2.0)]
    figures = measure([first, second], G)
    assert WARMUP == 1 and figures["periods_measured"] == 3
    assert figures["period_s"] == 4.0 and figures["gen_s"] == 3.0
    assert figures["period_s_runs"] == [5.0, 2.0]
    # the trained rewards summed (3 periods x 2 groups x 4 samples x 0.5) over the seconds summed (12)
    assert figures["reward_per_s"] == pytest.approx(3 * 2 * G * 0.5 / 12.0, abs=1e-4)
    with pytest.raises(ValueError, match="warm-up"):
        measure([[_row(0, 1.0)]], G)


def test_kept_pools_the_samples_not_the_periods() -> None:
    rows = [_sampled(0, 4.0, 1.0, 10), _sampled(1, 4.0, 0.0, 20) | {"groups": 1, "tokens_kept": 20 * G}]
    assert kept(rows, G) == {"response_len": pytest.approx(40 / 3, abs=1e-3), "reward": 0.6667}
    assert kept([], G) == {"response_len": 0.0, "reward": 0.0}


def test_the_twin_of_a_prompt_order_variant_is_its_arrival_one() -> None:
    assert twin("over50+zv@prompt", ["over50+zv", "over50+zv@prompt"]) == "over50+zv"
    assert twin("over50@prompt", ["over50@arrival", "over50@prompt"]) == "over50@arrival"
    assert twin("over50@prompt", ["over25", "over50@prompt"]) is None
    assert twin("over50+zv", ["over50+zv", "over50+zv@prompt"]) is None


def test_the_arrival_bias_compares_period_0_and_all_periods_arrival_less_prompt() -> None:
    arrival = [[_sampled(0, 4.0, 0.75, 6), _sampled(1, 4.0, 1.0, 4)]]
    prompt = [[_sampled(0, 4.0, 0.5, 10), _sampled(1, 4.0, 0.5, 10)]]
    bias = arrival_bias({"over50": arrival, "over50@prompt": prompt, "base": [[_row(0, 1.0)]]}, G)
    assert set(bias) == {"over50"}
    assert bias["over50"]["period0"] == {
        "len_arrival": 6.0,
        "len_prompt": 10.0,
        "len_diff": -4.0,
        "reward_arrival": 0.75,
        "reward_prompt": 0.5,
        "reward_diff": 0.25,
    }
    everything = bias["over50"]["all_periods"]
    assert (everything["len_arrival"], everything["reward_arrival"]) == (5.0, 0.875)
    assert (everything["len_diff"], everything["reward_diff"]) == (-5.0, 0.375)


def test_speedups_are_against_base_when_there_is_one() -> None:
    figures: dict[str, dict[str, Any]] = {
        "base": {"period_s": 6.0, "tail_s": 2.0},
        "over25": {"period_s": 4.0, "tail_s": 0.5},
    }
    speedups(figures)
    assert figures["over25"]["speedup_vs_base"] == 1.5 and figures["over25"]["tail_vs_base"] == 0.25
    assert figures["base"]["speedup_vs_base"] == 1.0
    alone: dict[str, dict[str, Any]] = {"over25": {"period_s": 4.0, "tail_s": 0.5}}
    speedups(alone)
    assert "speedup_vs_base" not in alone["over25"]


def test_the_pipelines_ideal_pairs_the_trained_groups_with_the_latest_arrivals() -> None:
    row = {"group_arrival_s": [1.0, 2.0], "micro_batch_train_s": [0.5, 0.5], "step_s": 0.25}
    assert ideal_period(row) == 2.5 + 0.25  # every arrival trained
    filtered = row | {"group_arrival_s": [0.5, 1.0, 2.0, 3.0]}  # two arrived and were not trained
    assert ideal_period(filtered) == 3.5 + 0.25
    assert ideal_period(filtered | {"micro_batch_train_s": [], "step_s": 0.0}) == 0.0
