"""Rollout correction (ops/correction.py) in every objective against a float64 reference written from
the formulas of docs/objectives.md; a no-op, bit for bit, where the engine's log-probs are the
learner's; and how it combines with the clipped ratio when the old policy is the engine's."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor

from cadence.ops.correction import LEVELS, CorrectionRule
from cadence.ops.losses import OBJECTIVES, objective_loss_sum, step_normaliser
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.steps import StepRule, Steps
from tests.conftest import scored
from tests.unit.test_mismatch import EVERY_GROUP_TRAINED, groups_with_engine
from tests.unit.test_objectives import CLIP, MAX_NEW_TOKENS, batch, learner

RULES = [CorrectionRule("truncate", level, cap=1.05) for level in LEVELS] + [
    CorrectionRule("mask", level, low=0.9, high=1.1) for level in LEVELS
]


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def reference_weights(
    rule: CorrectionRule, lp: list[float], engine: list[float], carried: bool
) -> list[float]:
    """Each token's weight in float64: rho of the level, f(rho), divided by rho when the ratio carries it."""
    logs = [a - b for a, b in zip(lp, engine, strict=True)]
    if rule.level == "token":
        rhos = [math.exp(d) for d in logs]
    elif rule.level == "sequence":
        rhos = [math.exp(sum(logs))] * len(logs)
    else:
        rhos = [math.exp(sum(logs) / len(logs))] * len(logs)
    out = []
    for rho in rhos:
        f = min(rho, rule.cap) if rule.mode == "truncate" else (rho if rule.low <= rho <= rule.high else 0.0)
        out.append(f / rho if carried else f)
    return out


def reference_loss(
    objective: str,
    rule: CorrectionRule,
    logp: list[list[Tensor]],
    old: list[list[float]],
    engine: list[list[float]],
    advantages: list[float],
    carried: bool,
) -> Tensor:
    """The step's loss in float64: each token's surrogate times its weight (gspo: the sample's term
    times its weight, or at the token level each token's log-prob entering s with its gradient times
    its weight, sg(lp) + c (lp - sg(lp)))."""
    low, high = CLIP[objective]
    total = torch.zeros((), dtype=torch.float64)
    tokens = 0
    for i, sample in enumerate(logp):
        a = advantages[i]
        c = reference_weights(rule, [float(x.detach()) for x in sample], engine[i], carried)
        tokens += len(sample)
        if objective == "gspo":
            held = [
                lp.detach() + (c[t] if rule.level == "token" else 1.0) * (lp - lp.detach())
                for t, lp in enumerate(sample)
            ]
            s = torch.exp(torch.stack([lp - old[i][t] for t, lp in enumerate(held)]).sum() / len(sample))
            term = -torch.minimum(s * a, torch.clamp(s, 1 - low, 1 + high) * a)
            total = total + term * (c[0] if rule.level != "token" else 1.0)
            continue
        terms = []
        for t, lp in enumerate(sample):
            r = torch.exp(lp - old[i][t])
            terms.append(-torch.minimum(r * a, torch.clamp(r, 1 - low, 1 + high) * a) * c[t])
        total = total + (sum(terms) / len(sample) if objective == "grpo" else sum(terms))
    samples = len(logp)
    normaliser = {"dapo": tokens, "grpo": samples, "gspo": samples, "dr_grpo": MAX_NEW_TOKENS * samples}
    return total / normaliser[objective]


@pytest.mark.parametrize(("objective", "rule"), list(itertools.product(OBJECTIVES, RULES)))
@pytest.mark.parametrize("carried", [False, True])
def test_each_correction_in_each_objective_equals_its_formula(
    objective: str, rule: CorrectionRule, carried: bool
) -> None:
    """`carried`: the old log-probs are the engine's (several steps a period), else the learner's own."""
    (lengths,), logp, engine, _, mask = batch(11, 0.25)
    old = engine if carried else logp
    advantages = torch.linspace(-1.5, 1.5, logp.shape[0])
    weights = rule.weights(logp, engine, mask, torch.full((logp.shape[0], 1), carried))
    policy = logp.clone().requires_grad_(True)
    loss, _ = objective_loss_sum(
        objective, policy, old, advantages, mask, *CLIP[objective], correction=weights
    )
    normaliser = step_normaliser(objective, "tokens", lengths, MAX_NEW_TOKENS)
    (loss / normaliser).backward()

    leaves = [[logp[i, t].double().requires_grad_(True) for t in range(n)] for i, n in enumerate(lengths)]
    rows = [[[float(x[i, t]) for t in range(n)] for i, n in enumerate(lengths)] for x in (old, engine)]
    want = reference_loss(objective, rule, leaves, rows[0], rows[1], advantages.tolist(), carried)
    want.backward()
    assert float(loss.detach()) / normaliser == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-7)
    assert policy.grad is not None
    want_grad = torch.zeros_like(logp, dtype=torch.float64)
    for i, sample in enumerate(leaves):
        for t, leaf in enumerate(sample):
            want_grad[i, t] = leaf.grad if leaf.grad is not None else 0.0
    assert want_grad.abs().max() > 0
    assert (policy.grad.double() - want_grad).abs().max() <= 1e-6 * max(1.0, float(want_grad.abs().max()))
    ws = weights.expand(mask.shape)[mask]
    assert bool((ws != 1.0).any())  # the weights do something here
    assert rule.mode != "mask" or rule.level != "token" or bool((ws == 0).any())


@pytest.mark.parametrize(("objective", "rule"), list(itertools.product(OBJECTIVES, RULES)))
def test_equal_log_probs_make_every_correction_a_no_op_bit_for_bit(
    objective: str, rule: CorrectionRule
) -> None:
    (_,), logp, old, _, mask = batch(5, 0.3)
    advantages = torch.linspace(-1.0, 1.2, logp.shape[0])
    results = []
    for correction in (None, rule.weights(logp, logp, mask, torch.zeros(logp.shape[0], 1, dtype=torch.bool))):
        policy = logp.clone().requires_grad_(True)
        loss, _ = objective_loss_sum(
            objective, policy, old, advantages, mask, *CLIP[objective], correction=correction
        )
        loss.backward()
        results.append((loss.detach(), policy.grad))
    (off, off_grad), (on, on_grad) = results
    assert torch.equal(off, on) and off_grad is not None and on_grad is not None
    assert torch.equal(off_grad, on_grad)


def corrected(objective: str, rule: CorrectionRule) -> TorchLearner:
    own = learner(objective, kl_beta=0.1)
    own.correction = rule
    return own


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("rule", [RULES[0], RULES[4]])
def test_a_learner_whose_engine_agrees_trains_as_without_a_correction(
    objective: str, rule: CorrectionRule
) -> None:
    groups, _, _ = groups_with_engine(0.0, rewards=EVERY_GROUP_TRAINED)
    plain, fixed = learner(objective, kl_beta=0.1), corrected(objective, rule)
    a, b = plain.train_groups(groups), fixed.train_groups(groups)
    assert a["loss_sum"] == b["loss_sum"]
    for p, q in zip(plain.model.parameters(), fixed.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
    assert fixed.step(10.0)["correction_weight"] == 1.0


def test_a_learner_applies_the_correction_of_its_engine_log_probs() -> None:
    """Far-off engine log-probs: masked tokens are counted, and the gradient differs from the plain one."""
    groups, _, _ = groups_with_engine(0.8)
    plain, fixed = learner("dapo", kl_beta=0.0), corrected("dapo", CorrectionRule("mask", "token"))
    plain.train_groups(groups)
    fixed.train_groups(groups)
    grads = [
        (p.grad, q.grad) for p, q in zip(plain.model.parameters(), fixed.model.parameters(), strict=True)
    ]
    assert any(not torch.equal(a, b) for a, b in grads if a is not None and b is not None)
    info = fixed.step(100.0)
    assert 0 < info["correction_zeroed"] < 1 and info["correction_weight"] > 0


def test_with_several_steps_the_correction_truncates_and_masks_the_clipped_ratio() -> None:
    """Old = engine: r = pi / pi_engine carries rho. One token each: A < 0 with rho = 5 (unclipped on
    that side) is truncated to the cap's weight, A > 0 with rho = 5 stays clipped (no gradient), a token
    inside the band keeps its ratio; masking drops what leaves the band."""
    logp = torch.zeros(3, 1)
    engine = torch.tensor([[-math.log(5.0)], [-math.log(5.0)], [-math.log(1.1)]])
    mask = torch.ones(3, 1, dtype=torch.bool)
    advantages = torch.tensor([-1.0, 1.0, -1.0])
    carried = torch.ones(3, 1, dtype=torch.bool)
    grads = {}
    for name, rule in (
        ("off", None),
        ("tis", CorrectionRule("truncate", cap=2.0)),
        ("mask", CorrectionRule("mask")),
    ):
        policy = logp.clone().requires_grad_(True)
        weights = rule.weights(logp, engine, mask, carried) if rule else None
        loss, _ = objective_loss_sum("dapo", policy, engine, advantages, mask, 0.2, 0.28, correction=weights)
        loss.backward()
        assert policy.grad is not None
        grads[name] = policy.grad.squeeze(-1).tolist()
    assert grads["off"] == pytest.approx([5.0, 0.0, 1.1])  # -A r: the full ratio, and the clip at A > 0
    assert grads["tis"] == pytest.approx([2.0, 0.0, 1.1])  # the ratio truncated at the cap
    assert grads["mask"] == pytest.approx([0.0, 0.0, 1.1])  # out of the band: no term


def test_several_steps_take_the_engine_log_probs_as_the_old_ones_and_one_step_as_the_engines() -> None:
    """Steps of one a period carry the sampler's log-probs as `engine_logprobs` (old: the learner's);
    of several, as the old ones, which the correction then treats as carrying rho."""
    group = scored(3, [[1, 2], [3]], [1.0, 0.0], [1.0, 0.0], 1.0, 0.1, {})
    one = TrainGroup.of(group, sampler_logprobs=False)
    several = TrainGroup.of(group, sampler_logprobs=True)
    assert one.old_logprobs is None and one.engine_logprobs == group.logprobs
    assert several.old_logprobs == group.logprobs and several.engine_logprobs is None
    assert one.engine_list() == several.engine_list() == group.logprobs
    seen: list[list[TrainGroup]] = []

    class Recording:
        def train_groups(self, groups: list[TrainGroup]) -> dict[str, float]:
            seen.append(groups)
            return {}

    for steps in (1, 2):
        Steps(Recording(), StepRule(steps_per_period=steps)).train([group])  # type: ignore[arg-type]
    assert seen[0][0].engine_logprobs == group.logprobs and seen[1][0].old_logprobs == group.logprobs


def test_an_unknown_mode_or_level_is_refused() -> None:
    with pytest.raises(ValueError, match="rollout_correction.mode"):
        CorrectionRule("clip")
    with pytest.raises(ValueError, match="rollout_correction.level"):
        CorrectionRule("truncate", "batch")
