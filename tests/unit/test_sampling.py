"""Over-sampled periods without sockets: the group filters as pure functions, the trainer's selection
of which groups a period trains (arrival and prompt order, short periods), and the dispatcher's ledger
with over-sampling, refills and the stop."""

from __future__ import annotations

import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadence.config import ConfigError, load_config
from cadence.dispatch.core import DispatchCore, Worker
from cadence.dispatch.ledger import Ledger, State
from cadence.dispatch.rounds import EvalRounds
from cadence.launch.settings import trainer_settings, worker_settings
from cadence.training.filters import Filters, GroupOutcome, load_filter, reward_range, zero_variance
from cadence.training.selection import Selection
from cadence.wire.messages import EpisodeFigures, GroupResult
from tests.unit.test_dispatch_core import Numbered, prompts

A, B = b"route-a", b"route-b"


def scored(
    rewards: list[float],
    completions: list[list[int]] | None = None,
    period: int = 0,
    prompt_id: int = 0,
    masks: list[list[int]] | None = None,
    truncated: list[bool] | None = None,
    episodes: EpisodeFigures | None = None,
) -> GroupResult:
    completions = completions or [[5, 6]] * len(rewards)
    return GroupResult(
        period=period,
        version=period,
        prompt_id=prompt_id,
        prompt_tokens=[1],
        completions=completions,
        logprobs=[[0.0] * len(c) for c in completions],
        rewards=rewards,
        correct=rewards,
        gen_s=0.0,
        load_s=0.0,
        finished_at=0.0,
        masks=masks or [],
        truncated=truncated or [],
        episodes=episodes,
    )


def outcome(*rewards: float) -> GroupOutcome:
    n = len(rewards)
    return GroupOutcome(0, 0, rewards, rewards, (3,) * n, (False,) * n)


# ---------------------------------------------------------------- filters


def test_zero_variance_keeps_only_a_group_whose_rewards_differ() -> None:
    assert not zero_variance(outcome(1.0, 1.0, 1.0))
    assert not zero_variance(outcome(0.0, 0.0))
    assert zero_variance(outcome(0.0, 1.0, 1.0))
    assert zero_variance(outcome(0.25, 0.5))


def test_reward_range_keeps_a_mean_inside_its_bounds() -> None:
    keeps = reward_range(0.2, 0.8)
    assert keeps(outcome(0.0, 1.0)) and keeps(outcome(0.2, 0.2))
    assert not keeps(outcome(1.0, 1.0, 1.0, 0.5)) and not keeps(outcome(0.0, 0.0, 0.0, 0.5))


def test_the_outcome_counts_only_sampled_tokens_and_reads_truncation_and_endings() -> None:
    group = scored(
        rewards=[1.0, 0.0],
        completions=[[5, 6, 7], [5, 6]],
        masks=[[1, 0, 1], [1, 1]],
        truncated=[True, False],
        episodes=EpisodeFigures(endings=["token_budget", "done"]),
    )
    seen = GroupOutcome.of(group)
    assert seen.lengths == (2, 2) and seen.truncated == (True, False)
    assert seen.endings == ("token_budget", "done") and seen.rewards == (1.0, 0.0)
    plain = GroupOutcome.of(scored(rewards=[1.0, 0.0], completions=[[5, 6, 7], [5]]))
    assert plain.lengths == (3, 1) and plain.truncated == (False, False) and plain.endings == ()


def user_module(monkeypatch: pytest.MonkeyPatch, **functions: object) -> str:
    module = types.ModuleType("my_filters")
    for name, fn in functions.items():
        setattr(module, name, fn)
    monkeypatch.setitem(sys.modules, "my_filters", module)
    return "my_filters"


def test_a_user_filter_decides_and_the_first_filter_that_drops_names_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_module(monkeypatch, short_only=lambda o: max(o.lengths) <= 2)
    filters = Filters.of(["zero_variance", "my_filters:short_only"])
    assert filters.reason(scored(rewards=[1.0, 1.0], completions=[[5, 6, 7], [5]])) == "zero_variance"
    assert filters.reason(scored(rewards=[1.0, 0.0], completions=[[5, 6, 7], [5]])) == "my_filters:short_only"
    assert filters.reason(scored(rewards=[1.0, 0.0], completions=[[5, 6], [5]])) is None


def test_a_filter_that_raises_or_answers_no_bool_is_logged_and_keeps_the_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(o: GroupOutcome) -> bool:
        raise ZeroDivisionError("the user's bug")

    user_module(monkeypatch, broken=broken, vague=lambda o: 0)
    filters = Filters.of(["my_filters:broken", "my_filters:vague"])
    assert filters.reason(scored(rewards=[1.0, 1.0])) is None
    logged = capsys.readouterr().out + capsys.readouterr().err
    assert "filter_failed" in logged and "ZeroDivisionError" in logged and "returned int" in logged


def test_a_filter_that_does_not_load_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    user_module(monkeypatch, value=3)
    with pytest.raises(ConfigError, match="sampling.filters: cannot import 'no_such_module_here'"):
        load_filter("no_such_module_here:f")
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_filter("my_filters:missing")
    with pytest.raises(ConfigError, match="not a function"):
        load_filter("my_filters:value")
    with pytest.raises(ConfigError, match="sampling.filters: 'nonsense'"):
        load_config(None, ["sampling.filters=['nonsense']"])
    with pytest.raises(ConfigError, match="sampling.reward_range"):
        load_config(None, ["sampling.reward_range=[0.9, 0.1]"])


def test_sampling_off_issues_exactly_b_prompts_and_on_up_to_its_ceiling() -> None:
    off = load_config(None, ["task.prompts_per_period=8"]).sampling
    assert not off.on and off.issued_at_most(8) == 8 and off.extra(8) == 0
    on = load_config(None, ["sampling.oversample=0.25", "sampling.ceiling=2"]).sampling
    assert on.on and on.extra(8) == 2 and on.issued_at_most(8) == 16
    wide = load_config(None, ["sampling.oversample=3", "sampling.ceiling=1"]).sampling
    assert wide.issued_at_most(8) == 8 + 24  # never fewer than the ones queued at the start


# ---------------------------------------------------------------- the trainer's selection


def group(period: int, stream: int, index: int, *rewards: float) -> GroupResult:
    return scored([float(r) for r in rewards], period=period, prompt_id=period * stream + index)


def test_arrival_order_keeps_the_first_b_kept_groups_and_closes() -> None:
    pick = Selection(2, batch=2, stream=6, order="arrival", filters=Filters.of(["zero_variance"]))
    verdicts = [pick.arrive(group(2, 6, i, *r)) for i, r in [(4, (1, 1)), (3, (0, 1)), (0, (0, 0))]]
    assert [[reason for _, reason in v] for v in verdicts] == [["zero_variance"], [None], ["zero_variance"]]
    assert not pick.closed
    assert [reason for _, reason in pick.arrive(group(2, 6, 5, 1, 0))] == [None]
    assert pick.closed and not pick.short and pick.kept == 2 and pick.filtered["zero_variance"] == 2
    assert pick.arrive(group(2, 6, 1, 1, 0)) == []  # closed: nothing more is resolved


def test_prompt_order_resolves_in_prompt_order_whatever_the_arrival_order() -> None:
    pick = Selection(1, batch=2, stream=8, order="prompt", filters=Filters.of(["zero_variance"]))
    assert pick.arrive(group(1, 8, 2, 0, 1)) == []  # waits for 0 and 1
    assert pick.arrive(group(1, 8, 3, 0, 1)) == []
    first = pick.arrive(group(1, 8, 0, 1, 1))
    assert [(g.prompt_id, r) for g, r in first] == [(8, "zero_variance")]
    settled = pick.arrive(group(1, 8, 1, 0, 1))
    assert [(g.prompt_id, r) for g, r in settled] == [(9, None), (10, None)]
    assert pick.closed and [g.prompt_id for g in pick.held()] == [11]  # arrived, then stopped


@given(st.permutations(range(6)), st.lists(st.booleans(), min_size=6, max_size=6))
def test_prompt_order_keeps_the_same_groups_in_any_arrival_order(
    order: list[int], varied: list[bool]
) -> None:
    def kept_in(arrivals: list[int]) -> list[int]:
        pick = Selection(0, batch=3, stream=6, order="prompt", filters=Filters.of(["zero_variance"]))
        kept: list[int] = []
        for i in arrivals:
            rewards = (0.0, 1.0) if varied[i] else (1.0, 1.0)
            kept += [g.prompt_id for g, r in pick.arrive(group(0, 6, i, *rewards)) if r is None]
        return kept

    assert kept_in(order) == kept_in(list(range(6))) == [i for i in range(6) if varied[i]][:3]


def test_a_period_whose_stream_is_resolved_short_of_b_closes_short() -> None:
    pick = Selection(0, batch=3, stream=4, order="arrival", filters=Filters.of(["zero_variance"]))
    for i, rewards in enumerate([(1, 1), (0, 1), (0, 0), (1, 1)]):
        pick.arrive(group(0, 4, i, *rewards))
    assert pick.closed and pick.short and pick.kept == 1 and pick.resolved == 4


def test_prompt_order_without_over_sampling_trains_a_periods_b_groups_in_prompt_order() -> None:
    """`sampling.order = 'prompt'` alone (no over-sampling, no filter): the B groups of a period are
    still handed to training in prompt order, whatever the order they come in (a reproducible run)."""
    for order, expected in (("prompt", [8, 9, 10, 11]), ("arrival", [10, 8, 11, 9])):
        cfg = load_config(None, ["task.prompts_per_period=4", f"sampling.order={order!r}"])
        pick = trainer_settings(cfg, 100).selection(2)
        assert not cfg.sampling.on and pick.stream == 4
        settled = [g.prompt_id for i in (2, 0, 3, 1) for g, _ in pick.arrive(group(2, 4, i, 1, 0))]
        assert settled == expected and pick.closed and not pick.short


@pytest.mark.parametrize(
    ("settings", "joins"),
    [
        ([], False),  # one worker in arrival order: its groups' order is the trainer's float order
        (["rollout.workers=2"], True),
        (["sampling.order='prompt'"], True),  # the order groups come in changes nothing
        (["sampling.order='prompt'", "rollout.join='off'"], False),
        (["rollout.join='on'"], True),
    ],
)
def test_continuous_batching_is_on_by_itself_where_the_order_of_arrival_changes_nothing(
    settings: list[str], joins: bool
) -> None:
    assert worker_settings(load_config(None, ["rollout.workers=1", *settings])).join is joins


def test_without_filters_a_selection_keeps_every_group_until_b() -> None:
    pick = Selection(0, batch=2, stream=2)
    assert [r for _, r in pick.arrive(group(0, 2, 1, 1, 1))] == [None]
    assert not pick.closed
    pick.arrive(group(0, 2, 0, 1, 1))
    assert pick.closed and not pick.short


# ---------------------------------------------------------------- the dispatcher's ledger and core


def test_the_ledger_adds_refills_and_stops_what_is_left() -> None:
    ledger = Ledger()
    ledger.open(0, prompts(0, 8)[:3])
    ledger.assign(A, 2)
    ledger.add(prompts(0, 8)[3:5])
    assert ledger.issued == 5 and ledger.queued == 3
    with pytest.raises(ValueError, match="repeat"):
        ledger.add(prompts(0, 8)[4:5])
    ledger.consume(0, [0])
    assert ledger.stop(1) == {}  # another period's stop changes nothing
    assert ledger.stop(0) == {A: [1]}
    assert ledger.queued == 0 and ledger.state(1) is State.STOPPED and ledger.state(4) is State.STOPPED
    assert ledger.state(0) is State.CONSUMED
    assert ledger.requeue(A) == 0 and ledger.assign(B, 5) == []  # a stopped prompt never goes out again
    assert ledger.consume(0, [1]) == 0


def oversampled(per_period: int = 4, extra: int = 1, stream: int = 8) -> DispatchCore:
    rounds = EvalRounds((), 0, 3, 1, keep_versions=2)
    return DispatchCore(Numbered(), 3, per_period, 4, rounds, extra=extra, stream=stream)  # type: ignore[arg-type]


def test_the_core_queues_b_and_the_extra_then_draws_more_for_filtered_groups() -> None:
    c = oversampled()
    c.announce(1, 0.0)
    assert c.ledger.issued == 5 and c.ledger.queued == 5  # B = 4 and one more, ids 8 x 1 + i
    c.credit(A, 5)
    sent = c.assign([Worker(A, "a")], "key")
    assert [a.prompt_id for _, a in sent] == [8, 9, 10, 11, 12]
    assert c.consume(1, [8], filtered=[8]) == {}  # 4 not filtered can still make B
    assert c.ledger.issued == 5
    c.consume(1, [9], filtered=[9])  # 3 left: one more drawn, the stream's next
    assert c.ledger.issued == 6 and c.ledger.queued == 1
    c.consume(1, [], filtered=[1234])  # an id the period never issued counts for nothing
    assert c.ledger.issued == 6
    held = c.consume(1, [10, 11], closed=False)
    assert held == {}
    held = c.consume(1, [12], closed=True)
    assert held == {} and c.ledger.queued == 0 and c.ledger.state(13) is State.STOPPED
    c.consume(1, [], filtered=[10, 11])  # after the close nothing is drawn
    assert c.ledger.issued == 6


def test_the_core_stops_at_the_streams_end_and_tells_the_holders() -> None:
    c = oversampled(per_period=2, extra=0, stream=3)
    c.announce(0, 0.0)
    c.credit(A, 1)
    c.credit(B, 1)
    c.assign([Worker(A, "a"), Worker(B, "b")], "key")
    c.consume(0, [0], filtered=[0])
    c.consume(0, [1], filtered=[1])  # two short: only one is left of the stream
    assert c.ledger.issued == 3
    c.credit(A, 1)
    assert [a.prompt_id for _, a in c.assign([Worker(A, "a"), Worker(B, "b")], "key")] == [2]
    held = c.consume(0, [], closed=True)
    assert held == {A: [2]}


def test_sampling_off_the_core_issues_b_prompts_as_before() -> None:
    c = oversampled(per_period=4, extra=0, stream=0)
    c.announce(2, 0.0)
    assert c.ledger.issued == 4 and [c.ledger.state(i) for i in range(8, 12)] == [State.QUEUED] * 4
