"""The four objectives against references written straight from their formulas (docs/objectives.md),
in float64 with a loop over samples and tokens; and the micro-batch split, which none may feel."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.ops.advantages import group_advantages
from cadence.ops.losses import OBJECTIVES, objective_loss_sum, step_normaliser
from cadence.training.learner import TorchLearner, TrainGroup, summarise
from tests.unit.test_prefix import CONFIGS, make_groups

CLIP = {"dapo": (0.2, 0.28), "grpo": (0.2, 0.28), "dr_grpo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}
MAX_NEW_TOKENS = 7
REWARDS = [[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]]


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def reference_advantages(rewards: list[float], scale: bool) -> list[float]:
    """(r - mean) / std, std the population std; all zero when std <= 1e-6; Dr. GRPO: r - mean."""
    mean = sum(rewards) / len(rewards)
    if not scale:
        return [r - mean for r in rewards]
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / std if std > 1e-6 else 0.0 for r in rewards]


def reference_objective(
    objective: str,
    logp: list[list[Tensor]],
    old: list[list[float]],
    ref: list[list[float]] | None,
    advantages: list[float],
    beta: float,
) -> Tensor:
    """The step's loss J (to minimise) in float64: `logp[i][t]` are 0-d float64 tensors with gradient."""
    low, high = CLIP[objective]
    total = torch.zeros((), dtype=torch.float64)
    tokens = 0
    for i, sample in enumerate(logp):
        a = advantages[i]
        terms = []
        for t, lp in enumerate(sample):
            kl = torch.zeros((), dtype=torch.float64)
            if ref is not None:
                d = ref[i][t] - lp
                kl = torch.exp(d) - d - 1.0
            r = torch.exp(lp - old[i][t])
            surrogate = -torch.minimum(r * a, torch.clamp(r, 1 - low, 1 + high) * a)
            terms.append((surrogate, kl))
        tokens += len(sample)
        if objective in ("dapo", "dr_grpo"):
            total = total + sum(s + beta * k for s, k in terms)
        elif objective == "grpo":
            total = total + sum(s + beta * k for s, k in terms) / len(sample)
        else:  # gspo: the sequence ratio, the geometric mean of the token ratios
            log_ratio = torch.stack([lp - old[i][t] for t, lp in enumerate(sample)]).sum()
            s_i = torch.exp(log_ratio / len(sample))
            clipped = -torch.minimum(s_i * a, torch.clamp(s_i, 1 - low, 1 + high) * a)
            total = total + clipped + beta * sum(k for _, k in terms) / len(sample)
    samples = len(logp)
    normaliser = {"dapo": tokens, "grpo": samples, "gspo": samples, "dr_grpo": MAX_NEW_TOKENS * samples}
    return total / normaliser[objective]


def batch(seed: int, spread: float) -> tuple[list[list[int]], Tensor, Tensor, Tensor, Tensor]:
    """Completion lengths, and padded [S, T] logp, old logp, reference logp and mask."""
    g = torch.Generator().manual_seed(seed)
    lengths = [len(c) for _, cs in make_groups(4) for c in cs][: sum(len(r) for r in REWARDS)]
    rows, width = len(lengths), max(lengths)
    mask = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    logp = -torch.rand(rows, width, generator=g) * 3 - 0.1
    old = logp + spread * torch.randn(rows, width, generator=g)
    ref = logp + 0.3 * torch.randn(rows, width, generator=g)
    return [lengths], logp, old, ref, mask


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("spread", [1e-4, 0.3])  # ratios inside GSPO's tiny clip range, and far out
def test_each_objective_equals_its_formula(objective: str, beta: float, spread: float) -> None:
    (lengths,), logp, old, ref, mask = batch(7, spread)
    scale = objective != "dr_grpo"
    advantages = torch.cat([group_advantages(torch.tensor(r), scale=scale) for r in REWARDS])
    want_adv = [a for r in REWARDS for a in reference_advantages(r, scale)]
    assert advantages.tolist() == pytest.approx(want_adv, abs=1e-6)

    policy = logp.clone().requires_grad_(True)
    loss, stats = objective_loss_sum(
        objective, policy, old, advantages, mask, *CLIP[objective], ref if beta else None, beta
    )
    normaliser = step_normaliser(objective, "tokens", lengths, MAX_NEW_TOKENS)
    (loss / normaliser).backward()

    leaves = [[logp[i, t].double().requires_grad_(True) for t in range(n)] for i, n in enumerate(lengths)]
    want = reference_objective(
        objective,
        leaves,
        [[float(old[i, t]) for t in range(n)] for i, n in enumerate(lengths)],
        [[float(ref[i, t]) for t in range(n)] for i, n in enumerate(lengths)] if beta else None,
        want_adv,
        beta,
    )
    want.backward()
    assert float(loss.detach()) / normaliser == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-7)
    assert policy.grad is not None
    want_grad = torch.zeros_like(logp, dtype=torch.float64)
    for i, sample in enumerate(leaves):
        for t, leaf in enumerate(sample):
            want_grad[i, t] = leaf.grad if leaf.grad is not None else 0.0
    assert want_grad.abs().max() > 0  # the check has teeth
    assert (policy.grad.double() - want_grad).abs().max() <= 1e-6 * max(1.0, float(want_grad.abs().max()))
    assert float(policy.grad[~mask].abs().max()) == 0.0  # padding takes no gradient
    assert ("kl_sum" in stats) == (beta > 0)


def test_the_normaliser_of_each_objective() -> None:
    lengths = [3, 5, 1, 7]
    assert step_normaliser("dapo", "tokens", lengths, 9) == 16.0
    assert step_normaliser("dapo", "samples", lengths, 9) == 4.0
    assert step_normaliser("grpo", "tokens", lengths, 9) == 4.0
    assert step_normaliser("gspo", "tokens", lengths, 9) == 4.0
    assert step_normaliser("dr_grpo", "tokens", lengths, 9) == 36.0
    assert step_normaliser("dapo", "tokens", [], 9) == 1.0  # never a division by zero
    with pytest.raises(ValueError, match="trainer.objective"):
        objective_loss_sum("ppo", *batch(1, 0.1)[1:3], torch.zeros(16), batch(1, 0.1)[4], 0.2, 0.2)


def test_gspo_clips_whole_samples_and_counts_their_tokens() -> None:
    """A sample whose sequence ratio leaves the range on its advantage's side is clipped as a whole
    (no gradient at any of its tokens); its tokens count as clipped."""
    mask = torch.tensor([[True, True, True], [True, True, False]])
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.01, 0.0, -0.004], [0.01, 0.0, 0.0]], requires_grad=True)  # s: e^0.002, e^0.005
    advantages = torch.tensor([1.0, 1.0])
    loss, stats = objective_loss_sum("gspo", logp, old, advantages, mask, 3e-4, 4e-4)
    loss.backward()
    assert logp.grad is not None
    assert float(logp.grad.abs().max()) == 0.0 and stats["clipped_tokens"] == 5.0
    inside, stats = objective_loss_sum("gspo", logp.detach() * 0.01, old, advantages, mask, 3e-4, 4e-4)
    assert stats["clipped_tokens"] == 0.0 and float(inside) < 0


def learner(objective: str, packing: str = "shared_prompt", kl_beta: float = 0.1) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    low, high = CLIP[objective] if objective != "gspo" else (0.2, 0.28)  # a range the shifts leave
    return TorchLearner(
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-3,
        0.0,
        low,
        high,
        kl_beta,
        1.0,
        packing=packing,
        objective=objective,
        temperature=0.7,
    )


def groups_with_old_logprobs() -> list[TrainGroup]:
    """Groups whose old log-probs are the policy's shifted, so ratios differ from 1 and some clip."""
    plain = [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(4), REWARDS, strict=True)]
    logp, mask, _, _, _ = learner("dapo")._logprobs(plain)
    g = torch.Generator().manual_seed(3)
    shifted = (logp.detach() + 0.4 * torch.randn(logp.shape, generator=g)).tolist()
    out, row = [], 0
    for group in plain:
        old = [shifted[row + i][: len(c)] for i, c in enumerate(group.completions)]
        out.append(TrainGroup(group.prompt, group.completions, group.rewards, old))
        row += len(group.completions)
    return out


def grads(model: torch.nn.Module) -> Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_no_objective_depends_on_the_micro_batch_split(objective: str) -> None:
    groups = groups_with_old_logprobs()
    whole, split = learner(objective), learner(objective)
    whole_stats = whole.train_groups(groups)
    parts = [split.train_groups(groups[:1]), split.train_groups(groups[1:3]), split.train_groups(groups[3:])]
    expected = grads(whole.model)
    assert expected.abs().max() > 0
    assert (grads(split.model) - expected).abs().max() <= 1e-5 * expected.abs().max()
    for key in ("loss_sum", "clipped_tokens", "kl_sum", "entropy_sum", "tokens"):
        assert sum(p[key] for p in parts) == pytest.approx(whole_stats[key], rel=1e-5, abs=1e-6)
    assert whole_stats["clipped_tokens"] > 0 or objective == "gspo"


def test_dr_grpo_does_not_scale_advantages_and_the_others_do() -> None:
    """Rewards {0, 2} (population std 1) give dapo's loss under dr_grpo; {0, 4} (std 2) the same under
    dapo (scaled advantages) and twice it under dr_grpo."""
    prompt, completions = make_groups(1)[0]
    completions = completions[:2]
    losses = {}
    for objective in ("dapo", "dr_grpo"):
        for top in (2.0, 4.0):
            stats = learner(objective, kl_beta=0.0).train_groups(
                [TrainGroup(prompt, completions, [0.0, top])]
            )
            losses[objective, top] = stats["loss_sum"]
    assert losses["dapo", 2.0] == pytest.approx(losses["dapo", 4.0], rel=1e-6)
    assert losses["dr_grpo", 2.0] == pytest.approx(losses["dapo", 2.0], rel=1e-6)
    assert losses["dr_grpo", 4.0] == pytest.approx(2 * losses["dr_grpo", 2.0], rel=1e-6)


def test_a_step_reports_means_over_the_trained_tokens_and_sums_over_the_normaliser() -> None:
    """The entropy is a mean over the tokens computed (`entropy_tokens`: samples of advantage 0 are
    not), the clip fraction and the KL over every trained token; the computed tokens as counted."""
    sums = {"loss_sum": -3.0, "clipped_tokens": 5.0, "kl_sum": 2.0, "entropy_sum": 60.0, "tokens": 40.0}
    sums |= {"entropy_tokens": 30.0, "computed_tokens": 77.0}
    info = summarise(sums, 8.0)
    assert info == {
        "loss_sum": -0.375,
        "clipped_tokens": 0.625,
        "kl_sum": 0.25,
        "entropy": 2.0,
        "clip_fraction": 0.125,
        "kl": 0.05,
        "computed_tokens": 77.0,
        "loss_tokens": 30.0,  # the sampled tokens of the computed samples
    }
    assert "kl" not in summarise({k: v for k, v in sums.items() if k != "kl_sum"}, 8.0)  # no reference
    assert summarise({}, 1.0) == {}  # a rank without a share


def test_the_kl_of_a_moved_policy_is_its_k3_mean() -> None:
    """After a step the policy has left the reference: the next micro-batch's `kl` is its k3 mean."""
    own = learner("dapo", kl_beta=0.1)
    groups = groups_with_old_logprobs()
    own.train_groups(groups)
    own.step(100.0)
    stats = own.train_groups(groups)
    logp, mask, ref, _, _ = own._logprobs(groups)
    assert ref is not None
    delta = (ref - logp.detach()).double()[mask]
    want = float((delta.exp() - delta - 1).mean())
    assert want > 1e-6
    assert stats["kl_sum"] / stats["tokens"] == pytest.approx(want, rel=1e-4)
    assert own.step(stats["tokens"])["kl"] == pytest.approx(want, rel=1e-3)
