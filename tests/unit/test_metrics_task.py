"""Period figures (overlap, serial finish, the metrics line, the run summary) and the digits task."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.config import TaskConfig, load_config
from cadence.monitor.metrics import PeriodStats, overlap, samples_digest, serial_finish
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import summarize
from cadence.tasks.digits import DigitsTask
from tests.conftest import scored

# ---------------------------------------------------------------- overlap and serial finish


def test_overlap_counts_only_the_part_inside_the_window() -> None:
    spans = [(1.0, 3.0), (4.0, 6.0), (9.0, 12.0), (-2.0, 0.5)]
    # window [0, 10]: (-2, 0.5) -> 0.5; (1, 3) -> 2; (4, 6) -> 2; (9, 12) -> 1
    assert overlap(spans, 0.0, 10.0) == pytest.approx(5.5)


def test_overlap_of_spans_outside_or_empty_is_zero() -> None:
    assert overlap([(11.0, 12.0), (-3.0, -1.0)], 0.0, 10.0) == 0.0
    assert overlap([], 0.0, 10.0) == 0.0
    assert overlap([(2.0, 5.0)], 3.0, 3.0) == 0.0


def test_serial_finish_waits_for_arrivals_and_adds_costs() -> None:
    # busy from 1 to 3, idle gap until 10, then 10 -> 11 -> 13
    assert serial_finish(0.0, [1.0, 10.0, 10.5], [2.0, 1.0, 2.0]) == pytest.approx(13.0)


def test_serial_finish_takes_arrivals_in_time_order() -> None:
    in_order = serial_finish(0.0, [1.0, 2.0, 8.0], [5.0, 1.0, 0.5])
    shuffled = serial_finish(0.0, [8.0, 1.0, 2.0], [0.5, 5.0, 1.0])
    assert in_order == shuffled == pytest.approx(8.5)


def test_serial_finish_starts_no_earlier_than_start_and_handles_no_arrivals() -> None:
    assert serial_finish(5.0, [1.0, 2.0], [1.0, 1.0]) == pytest.approx(7.0)
    assert serial_finish(5.0, [], []) == 5.0


def test_serial_finish_refuses_mismatched_lists() -> None:
    with pytest.raises(ValueError):
        serial_finish(0.0, [1.0, 2.0], [1.0])


# ---------------------------------------------------------------- PeriodStats


def _stats() -> PeriodStats:
    stats = PeriodStats(period=3, start=100.0)
    stats.arrived(102.0, "w1", scored(7, [[1, 2], [3]], [1.0, 0.0], [1.0, 0.0], gen_s=1.5, load_s=0.2))
    stats.arrived(
        105.0, "w2", scored(8, [[4, 5, 6], [7, 8, 9]], [0.5, 0.5], [0.0, 1.0], gen_s=2.5, load_s=0.4)
    )
    stats.spans = [(102.5, 104.0), (105.0, 106.0)]
    stats.step_s = 0.5
    stats.stale_dropped = 2
    return stats


def test_period_finish_keys_and_values() -> None:
    row = _stats().finish(end=108.0, publish_s=1.0).to_row()
    assert set(row) >= {
        "period",
        "version",
        "groups",
        "samples",
        "reward_mean",
        "reward_std",
        "accuracy",
        "period_s",
        "gen_s",
        "train_s",
        "overlap_s",
        "tail_s",
        "trainer_idle_s",
        "publish_s",
        "tokens_generated",
        "workers_active",
        "samples_sha256",
    }
    assert (row["period"], row["version"], row["groups"], row["samples"]) == (3, 3, 2, 4)
    assert row["reward_mean"] == pytest.approx(0.5)
    assert row["reward_std"] == pytest.approx((0.5**2 * 2 / 4) ** 0.5)
    assert row["accuracy"] == pytest.approx(0.5)
    assert row["tokens_generated"] == 9
    assert row["response_len_mean"] == pytest.approx(9 / 4)
    assert row["period_s"] == pytest.approx(8.0)
    assert row["gen_s"] == pytest.approx(5.0)  # last arrival - start
    assert row["train_s"] == pytest.approx(1.5 + 1.0 + 0.5)
    assert row["overlap_s"] == pytest.approx(1.5)  # only (102.5, 104) lies before the last arrival
    assert row["tail_s"] == pytest.approx(108.0 - 1.0 - 105.0)
    assert row["weight_load_s"] == pytest.approx(0.4)
    assert row["weight_sync_s"] == pytest.approx(1.4)
    assert row["workers_active"] == 2
    assert row["stale_dropped"] == 2
    assert row["group_arrival_s"] == [2.0, 5.0]
    assert row["micro_batch_train_s"] == [1.5, 1.0] and row["micro_batches"] == 2
    assert row["step_s"] == pytest.approx(0.5)
    assert row["forward_backward_s"] == pytest.approx(1.5 + 1.0)  # train_s without the step
    assert row["tokens_kept"] == 9 and row["tokens_trained"] == 0  # no step trained a token


def test_the_computed_tokens_are_summed_and_no_entropy_is_made_up_when_none_was_computed() -> None:
    """A period whose every group had rewards all equal computes nothing: its row says so (null),
    not an entropy of 0, which would read as a collapsed policy; the scalar writers leave it out."""
    from cadence.monitor.writers import scalars

    stats = _stats()
    stats.stepped({"computed_tokens": 0.0, "clip_fraction": 0.0, "lr": 1e-5})
    row = stats.finish(end=108.0, publish_s=1.0).to_row()
    assert row["entropy"] is None and row["tokens_computed"] == 0 and row["tokens_kept"] == 9
    assert "entropy" not in scalars(row) and PeriodMetrics.from_row(row).entropy is None
    computed = _stats()
    computed.stepped({"computed_tokens": 30.0, "entropy": 1.0, "loss_tokens": 5.0})
    computed.stepped({"computed_tokens": 12.0, "entropy": 2.0, "loss_tokens": 2.0})
    row = computed.finish(end=108.0, publish_s=1.0).to_row()
    assert row["tokens_trained"] == 7 and row["tokens_kept"] == 9  # what reached the loss, of the kept
    assert row["entropy"] == pytest.approx(1.5) and row["tokens_computed"] == 42


def test_period_time_adds_up() -> None:
    row = _stats().finish(end=108.0, publish_s=1.0).to_row()
    assert row["period_s"] == pytest.approx(row["train_s"] + row["trainer_idle_s"] + row["publish_s"])
    assert row["trainer_idle_s"] == pytest.approx(8.0 - 3.0 - 1.0)


def test_empty_period_has_zero_rates_not_errors() -> None:
    row = PeriodStats(period=0, start=10.0).finish(end=10.0, publish_s=0.0).to_row()
    assert row["samples"] == 0 and row["reward_mean"] == 0.0 and row["tokens_per_s"] == 0.0
    assert row["gen_s"] == 0.0


def test_samples_digest_is_order_independent_and_content_sensitive() -> None:
    a = {1: [[1, 2]], 2: [[3]]}
    b = {2: [[3]], 1: [[1, 2]]}
    assert samples_digest(a) == samples_digest(b)
    assert samples_digest(a) != samples_digest({1: [[1, 2]], 2: [[4]]})
    assert samples_digest(a) != samples_digest({1: [[1]], 2: [[2, 3]]})


# ---------------------------------------------------------------- summarize


def _row(i: int) -> PeriodMetrics:
    return PeriodMetrics.from_row(
        {
            "groups": 4,
            "samples": 16,
            "tokens_generated": 10 * i,
            "reward_mean": float(i),
            "accuracy": i / 100,
            "stale_dropped": i % 2,
            "duplicates_dropped": 1,
            "period_s": 2.0,
            "overlap_s": 0.5,
        }
    )


def test_summarize_means_over_first_and_last_tenth_and_sums() -> None:
    rows = [_row(i) for i in range(20)]  # a tenth is 2 periods
    summary = summarize(rows, "periodic", wall_s=41.0, version=20, sha256="ab")
    assert summary["mode"] == "periodic"
    assert summary["periods"] == 20
    assert summary["groups_trained"] == 80
    assert summary["samples"] == 320
    assert summary["tokens_generated"] == 10 * sum(range(20))
    assert summary["reward_mean_first"] == pytest.approx(0.5)
    assert summary["reward_mean_last"] == pytest.approx(18.5)
    assert summary["accuracy_first"] == pytest.approx(0.005)
    assert summary["accuracy_last"] == pytest.approx(0.185)
    assert summary["stale_dropped"] == 10
    assert summary["duplicates_dropped"] == 20
    assert summary["period_s_mean"] == pytest.approx(2.0)
    assert summary["overlap_s_total"] == pytest.approx(10.0)
    assert (summary["wall_s"], summary["final_version"], summary["weights_sha256"]) == (41.0, 20, "ab")


def test_summarize_short_and_empty_runs() -> None:
    summary = summarize([_row(3), _row(5)], "sync", 1.0, 2, "")
    assert summary["reward_mean_first"] == 3.0 and summary["reward_mean_last"] == 5.0
    empty = summarize([], "sync", 0.0, 0, "")
    assert empty["periods"] == 0 and empty["reward_mean_first"] == 0.0 and empty["samples"] == 0


# ---------------------------------------------------------------- digits task


def task(**changes: object) -> DigitsTask:
    return DigitsTask(dataclasses.replace(TaskConfig(), **changes), seed=5)  # type: ignore[arg-type]


def test_prompts_are_deterministic_per_seed_and_period() -> None:
    assert task().prompts(4, 8) == task().prompts(4, 8)
    assert task().prompts(4, 8) != task().prompts(5, 8)
    assert DigitsTask(TaskConfig(), seed=6).prompts(4, 8) != task().prompts(4, 8)


def test_prompt_ids_are_period_times_count_plus_index() -> None:
    prompts = task().prompts(3, 5)
    assert [p.prompt_id for p in prompts] == [15, 16, 17, 18, 19]


@pytest.mark.parametrize("rule", ["sum", "copy", "max"])
def test_answers_follow_the_rule(rule: str) -> None:
    prompts = task(rule=rule, digits=3).prompts(0, 40)
    for p in prompts:
        if rule == "sum":
            assert p.text.endswith("=") and p.text.count("+") == 2
            digits = [int(d) for d in p.text[:-1].split("+")]
            assert p.answer == str(sum(digits) % 10)
        else:
            assert len(p.text) == 3 and p.text.isdigit()
            digits = [int(d) for d in p.text]
            assert p.answer == str(digits[-1] if rule == "copy" else max(digits))


def test_answer_examples_by_hand() -> None:
    assert task(rule="sum")._answer([7, 5]) == "2"
    assert task(rule="copy")._answer([7, 5]) == "5"
    assert task(rule="max")._answer([7, 5]) == "7"


@pytest.mark.parametrize(
    ("reward", "response", "finished", "expected_reward", "expected_correct"),
    [
        ("exact", "3", True, 1.0, 1.0),
        ("exact", "5", True, 0.25, 0.0),
        ("exact", "3", False, 0.0, 0.0),  # unfinished: not well formed, so not correct either
        ("exact", "33", True, 0.0, 0.0),
        ("exact", "x", True, 0.0, 0.0),
        ("exact", "", True, 0.0, 0.0),
        ("distance", "3", True, 1.0, 1.0),
        ("distance", "5", True, 0.25 + 0.75 * (1 - 2 / 9), 0.0),
        ("distance", "9", True, 0.25 + 0.75 * (1 - 6 / 9), 0.0),
        ("distance", "3", False, 0.0, 0.0),
        ("distance", "3+", True, 0.0, 0.0),
    ],
)
def test_score(
    reward: str, response: str, finished: bool, expected_reward: float, expected_correct: float
) -> None:
    score = task(reward=reward, format_weight=0.25).score("1+2=", response, "3", finished)
    assert score.reward == pytest.approx(expected_reward)
    assert score.correct == expected_correct


def test_format_weight_scales_the_well_formed_share() -> None:
    assert task(reward="exact", format_weight=0.5).score("1+2=", "4", "3", True).reward == pytest.approx(0.5)
    assert task(reward="exact", format_weight=0.0).score("1+2=", "4", "3", True).reward == 0.0


def test_bad_task_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="task.digits"):
        task(digits=0)
    with pytest.raises(ValueError, match="task.format_weight"):
        load_config(None, ["task.format_weight=1.5"])


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.sampled_from(["exact", "distance"]),
    st.floats(0.0, 1.0),
    st.text(alphabet=DigitsTask.alphabet + "ab ", max_size=4),
    st.sampled_from("0123456789"),
    st.booleans(),
)
def test_reward_is_within_zero_and_one(
    reward: str, weight: float, response: str, answer: str, finished: bool
) -> None:
    score = task(reward=reward, format_weight=weight).score("1+2=", response, answer, finished)
    assert 0.0 <= score.reward <= 1.0
    assert score.correct in (0.0, 1.0)
    if score.correct:
        assert score.reward == pytest.approx(1.0)


def test_score_of_a_non_ascii_digit_is_malformed() -> None:
    score = task(reward="distance").score("1+2=", "²", "3", True)
    assert score.reward == 0.0 and score.correct == 0.0


def test_an_over_sampled_period_trains_only_its_kept_groups_and_counts_the_rest() -> None:
    stats = PeriodStats(period=3, start=100.0, oversampled=True)
    kept, dropped, late = (
        scored(7, [[1, 2], [3]], [1.0, 0.0], [1.0, 0.0]),
        scored(8, [[4, 5, 6], [7, 8, 9]], [0.5, 0.5], [0.0, 1.0]),
        scored(9, [[1], [1]], [0.0, 0.0], [0.0, 0.0]),
    )
    stats.arrived(101.0, "w1", dropped, kept=False)
    stats.filtered_out(dropped, "zero_variance")
    stats.arrived(102.0, "w1", kept, kept=False)
    stats.kept(102.0, kept)
    stats.arrived(103.0, "w2", late, kept=False)
    stats.stopped_after_close(late)
    row = stats.finish(end=108.0, publish_s=1.0).to_row()
    assert (row["groups"], row["groups_arrived"], row["groups_filtered"]) == (1, 3, 1)
    assert row["filtered_zero_variance"] == 1 and row["tokens_filtered"] == 6 + 2
    assert row["tokens_kept"] == 3 and row["tokens_generated"] == 3 + 6 + 2
    assert row["samples"] == 6 and row["reward_mean"] == pytest.approx(2.0 / 6)  # every arrived sample
    assert row["reward_kept_mean"] == pytest.approx(0.5)
    assert row["tail_s"] == pytest.approx(108.0 - 1.0 - 102.0)  # from the last kept group
    assert row["gen_s"] == pytest.approx(3.0)  # the last arrival, kept or not
    assert row["samples_sha256"] == samples_digest({7: [[1, 2], [3]]})  # what was trained
