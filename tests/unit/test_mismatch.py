"""The gap between the engine's log-probs and the learner's (ops/mismatch.py, monitor/mismatch.py)
against float64 references written from their formulas, environment tokens left out; and the learner's
figures of it from the forward it trains with."""

from __future__ import annotations

import math

import pytest
import torch
from structlog.testing import capture_logs
from torch import Tensor

from cadence.monitor.mismatch import WARN_EVERY, MismatchWatch, period_mismatch
from cadence.ops.mismatch import add_sums, mismatch_figures, mismatch_sums
from cadence.training.learner import TrainGroup
from tests.unit.test_objectives import REWARDS, learner
from tests.unit.test_prefix import make_groups

BOUND = 2.0


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def gap_batch(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """logp, engine [6, 8] with some ratios far beyond the bound, a mask with environment tokens (whose
    engine log-probs are garbage: 0, inf, nan) and padding, and each sample's count."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(6, 8, generator=g) * 3 - 0.05
    engine = logp + 0.4 * torch.randn(6, 8, generator=g)
    engine[1, 2] = logp[1, 2] - 1.5  # ratio e^1.5 > 2
    engine[3, 0] = logp[3, 0] + 2.0  # ratio e^-2 < 1/2
    mask = torch.ones(6, 8, dtype=torch.bool)
    mask[0, 5:] = False  # padding
    mask[2, 1:4] = False  # an environment's turn
    mask[4, :] = False  # a sample of environment tokens only
    engine[2, 1], engine[2, 2], engine[2, 3] = 0.0, float("inf"), float("nan")
    counts = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 1.0])
    return logp, engine, mask, counts


def reference(logp: Tensor, engine: Tensor, mask: Tensor, counts: Tensor) -> dict[str, float]:
    """The figures in float64 with a loop over the sampled tokens: rho = exp(lp - e), k3 = rho - 1 -
    log rho, each sample counted `counts[i]` times."""
    tokens = k3 = ratio = beyond = samples = beyond_samples = 0.0
    extremes: list[float] = []
    for i in range(logp.shape[0]):
        n, far = float(counts[i]), False
        seen = False
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            d = float(logp[i, t]) - float(engine[i, t])
            rho = math.exp(d)
            tokens += n
            k3 += n * (rho - 1.0 - d)
            ratio += n * rho
            extremes.append(rho)
            out = rho > BOUND or rho < 1 / BOUND
            beyond += n * out
            far, seen = far or out, True
        samples += n * seen
        beyond_samples += n * far
    return {
        "mismatch_kl": k3 / tokens,
        "mismatch_ratio_mean": ratio / tokens,
        "mismatch_ratio_min": min(extremes),
        "mismatch_ratio_max": max(extremes),
        "mismatch_beyond_token_share": beyond / tokens,
        "mismatch_beyond_sample_share": beyond_samples / samples,
        "mismatch_tokens": tokens,
        "mismatch_samples": samples,
    }


def test_the_figures_equal_their_formulas_over_the_sampled_tokens_only() -> None:
    logp, engine, mask, counts = gap_batch(1)
    got = mismatch_figures(mismatch_sums(logp, engine, mask, counts, BOUND))
    want = reference(logp, engine, mask, counts)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert want["mismatch_beyond_token_share"] > 0 and want["mismatch_ratio_max"] > BOUND
    assert all(math.isfinite(v) for v in got.values())  # the environment's garbage is never read


def test_the_k3_of_a_rounding_level_gap_is_measured_not_rounded_away() -> None:
    """d ~ 1e-7 gives k3 ~ 5e-15: float32 r - 1 - log r would return noise or 0."""
    logp = torch.full((1, 4), -1.0, dtype=torch.float32)
    engine = logp.double() - 1e-7
    got = mismatch_figures(mismatch_sums(logp, engine, torch.ones(1, 4, dtype=torch.bool), None, BOUND))
    assert got["mismatch_kl"] == pytest.approx(0.5e-14, rel=1e-3)


def test_nothing_measured_gives_no_figures() -> None:
    logp, engine, _, counts = gap_batch(2)
    assert mismatch_sums(logp, engine, torch.zeros_like(logp, dtype=torch.bool), counts, BOUND) == {}
    assert mismatch_figures({}) == {} and period_mismatch([{"loss_sum": 1.0}]) == {}


def test_split_micro_batches_steps_and_ranks_add_to_the_whole() -> None:
    """Sums of any split, added with `add_sums` (extremes by min and max), give the whole's figures;
    a period of several steps gives those of one step over the same tokens."""
    logp, engine, mask, counts = gap_batch(3)
    whole = mismatch_figures(mismatch_sums(logp, engine, mask, counts, BOUND))
    parts: dict[str, float] = {}
    steps = []
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        sums = mismatch_sums(logp[rows], engine[rows], mask[rows], counts[rows], BOUND)
        add_sums(parts, sums)
        steps.append(mismatch_figures(sums))
    assert mismatch_figures(parts) == pytest.approx(whole, rel=1e-12)
    period = period_mismatch([s for s in steps if s] + [{"loss_sum": 0.5}])
    assert period == pytest.approx({k: v for k, v in whole.items() if k in period}, rel=1e-12)
    assert len(period) == 6


def test_the_warning_is_logged_above_its_level_and_throttled() -> None:
    watch = MismatchWatch(0.01)
    high, low = {"mismatch_kl": 0.02}, {"mismatch_kl": 0.005}
    with capture_logs() as logs:
        said = [watch.check(p, high if p != 1 else low) for p in range(2 * WARN_EVERY + 1)]
    assert said == [True] + [False] * (WARN_EVERY - 1) + [True] + [False] * (WARN_EVERY - 1) + [True]
    assert [e["period"] for e in logs if e["event"] == "mismatch_high"] == [0, WARN_EVERY, 2 * WARN_EVERY]
    assert logs[0]["warn_kl"] == 0.01 and logs[0]["mismatch_kl"] == 0.02  # not `level`: the log's own
    assert not MismatchWatch(0.0).check(0, high)  # 0: never
    assert not MismatchWatch(0.01).check(0, {})  # a row without the figure


EVERY_GROUP_TRAINED = [*REWARDS[:3], [0.3, 0.1, 0.3, 0.9]]  # no group of equal rewards


def groups_with_engine(
    shift: float, masks: bool = False, rewards: list[list[float]] = REWARDS
) -> tuple[list[TrainGroup], Tensor, Tensor]:
    """The test groups with engine log-probs = the learner's own (from a pass over every sample)
    shifted by N(0, shift²) noise (and, with `masks`, each completion's second token an environment's,
    its engine log-prob 0.0); the learner's log-probs and the loss mask."""
    plain = [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(4), rewards, strict=True)]
    if masks:
        plain = [
            TrainGroup(
                g.prompt,
                g.completions,
                g.rewards,
                masks=[[int(t != 1) for t in range(len(c))] for c in g.completions],
            )
            for g in plain
        ]
    logp, mask, _, _, _ = learner("dapo", kl_beta=0.0)._logprobs(plain)
    noise = shift * torch.randn(logp.shape, generator=torch.Generator().manual_seed(4))
    engine = torch.where(mask, logp.detach() + noise, torch.zeros_like(logp)).tolist()
    out, row = [], 0
    for g in plain:
        given = [engine[row + i][: len(c)] for i, c in enumerate(g.completions)]
        out.append(TrainGroup(g.prompt, g.completions, g.rewards, masks=g.masks, engine_logprobs=given))
        row += len(g.completions)
    return out, logp.detach(), mask


@pytest.mark.parametrize("masks", [False, True])
def test_the_learner_reports_the_gap_of_the_forward_it_trains_with(masks: bool) -> None:
    """The figures of a micro-batch are those of the float64 reference over the samples it computes
    (advantage ≠ 0: a group of equal rewards is not), environment tokens excluded."""
    groups, logp, mask = groups_with_engine(0.3, masks)
    own = learner("dapo", kl_beta=0.0)
    stats = own.train_groups(groups)
    engine = torch.zeros_like(logp)
    computed = torch.zeros(logp.shape[0], dtype=torch.bool)
    row = 0
    for g in groups:
        for values in g.engine_logprobs or []:
            engine[row, : len(values)] = torch.tensor(values)
            computed[row] = len(set(g.rewards)) > 1
            row += 1
    assert not bool(computed.all()) and bool(computed.any())
    want = reference(logp, engine.double(), mask & computed.unsqueeze(-1), torch.ones(logp.shape[0]))
    assert mismatch_figures(stats) == pytest.approx(want, rel=1e-5)
    step = own.step(100.0)
    assert step["mismatch_kl"] == pytest.approx(want["mismatch_kl"], rel=1e-5)
    assert "correction_weight" not in step  # no correction asked


def test_the_learner_against_its_own_log_probs_measures_no_gap() -> None:
    """Every sample computed, in the same packed row as the pass that gave the engine's log-probs: the
    same bits, ratio exactly 1. (With other rows the packing changes the float summation order: the
    ratio is 1 within float32 rounding, the first test's 1e-5.)"""
    groups, _, _ = groups_with_engine(0.0, rewards=EVERY_GROUP_TRAINED)
    figures = mismatch_figures(learner("dapo", kl_beta=0.0).train_groups(groups))
    assert figures["mismatch_kl"] == 0.0
    assert figures["mismatch_ratio_min"] == figures["mismatch_ratio_max"] == 1.0


def test_a_group_without_engine_log_probs_is_not_measured() -> None:
    plain = [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(4), REWARDS, strict=True)]
    stats = learner("dapo", kl_beta=0.0).train_groups(plain)
    assert mismatch_figures(stats) == {} and "mismatch_tokens" not in stats


def test_the_ranks_statistics_add_with_their_extremes_by_min_and_max() -> None:
    """`train_share` gathers every rank's sums: the counts and sums add, the ratio's extremes are the
    smallest and the largest of the ranks' (a stand-in for the other rank's gather)."""
    import msgpack

    from cadence.training.parallel import train_share
    from cadence.training.ranks import Ranks

    groups, _, _ = groups_with_engine(0.3)
    own = learner("dapo", kl_beta=0.0)
    other = {"tokens": 5.0, "mismatch_tokens": 5.0, "mismatch_ratio_min": 1e-3, "mismatch_ratio_max": 1.0}

    class TwoRanks:
        ranks = Ranks(rank=0, world=2)

        def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
            self.mine = msgpack.unpackb(data)
            return [data, msgpack.packb(other)]

    comm = TwoRanks()
    total = train_share(own, groups, comm)  # type: ignore[arg-type]
    mine = comm.mine
    assert total["mismatch_tokens"] == mine["mismatch_tokens"] + 5.0
    assert (
        total["mismatch_ratio_min"] == 1e-3
        and total["mismatch_ratio_max"] == mine["mismatch_ratio_max"] > 1.0
    )
    assert total["mismatch_k3_sum"] == mine["mismatch_k3_sum"]  # a sum the other rank lacks: its own


def test_a_period_row_carries_its_steps_gap_and_reads_back() -> None:
    from cadence.monitor.metrics import PeriodStats
    from cadence.monitor.period_metrics import PeriodMetrics

    logp, engine, mask, counts = gap_batch(6)
    steps = [
        mismatch_figures(mismatch_sums(logp[r], engine[r], mask[r], counts[r], BOUND))
        for r in (slice(0, 3), slice(3, 6))
    ]
    stats = PeriodStats(period=0, start=0.0)
    for info in steps:
        stats.stepped(info | {"correction_weight": 0.5, "correction_zeroed": 0.25})
    row = stats.finish(end=1.0, publish_s=0.1).to_row()
    want = reference(logp, engine, mask, counts)
    for key in ("mismatch_kl", "mismatch_ratio_min", "mismatch_ratio_max", "mismatch_beyond_sample_share"):
        assert row[key] == pytest.approx(want[key], rel=1e-12)
    assert (row["correction_weight"], row["correction_zeroed"]) == (0.5, 0.25)
    assert PeriodMetrics.from_row(row).to_row() == row
    assert "mismatch_kl" not in PeriodStats(period=0, start=0.0).finish(1.0, 0.1).to_row()  # nothing measured
