"""The learner on a micro-batch of several groups: the same loss and gradients as group by group."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.training.learner import TorchLearner, TrainGroup
from tests.unit.test_prefix import CONFIGS, make_groups, unpacked

REWARDS = [[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.8]]


def learner(packing: str, kl_beta: float = 0.1) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    model = init_model(cfg, seed=5)
    return TorchLearner(model, cfg, CharTokenizer(), 1e-3, 0.0, 0.2, 0.28, kl_beta, 1.0, packing=packing)


def grads(learner: TorchLearner) -> Tensor:
    return torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])


def micro_batch() -> list[TrainGroup]:
    return [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(3), REWARDS, strict=True)]


def one_by_one() -> tuple[float, Tensor]:
    reference = learner("padded")
    loss = sum(reference.train_group(g.prompt, g.completions, g.rewards)["loss_sum"] for g in micro_batch())
    return loss, grads(reference)


@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_a_micro_batch_of_unequal_groups_equals_group_by_group(packing: str) -> None:
    loss, expected = one_by_one()
    packed = learner(packing)
    stats = packed.train_groups(micro_batch())
    assert stats["tokens"] == sum(len(c) for g in micro_batch() for c in g.completions)
    assert stats["loss_sum"] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert expected.abs().max() > 0  # the check has teeth: there is a gradient
    assert (grads(packed) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_the_head_only_where_read_gives_the_full_logits_there() -> None:
    model = init_model(CONFIGS["llama"], seed=2)
    ids = torch.randint(1, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    at = torch.rand(3, 9, generator=torch.Generator().manual_seed(1)) < 0.4
    with torch.no_grad():
        full, picked = model(ids), model(ids, logits_at=at)
    assert picked.shape == (int(at.sum()), CONFIGS["llama"].vocab_size)
    assert (picked - full[at]).abs().max() <= 1e-5


@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_every_packing_reads_the_log_probs_of_the_full_logits(packing: str) -> None:
    """The learner's log-probs (head applied only where a target is read) against `pad_group`'s
    log-softmax over every position's logits, policy and reference alike."""
    own = learner(packing)
    logp, mask, ref, _, _ = own._logprobs(micro_batch())
    assert ref is not None
    with torch.no_grad():
        full = [unpacked(own.model, g.prompt, g.completions) for g in micro_batch()]
    expected = torch.cat([values[where] for values, where in full])
    assert int(mask.sum()) == expected.numel()
    assert (logp[mask].detach() - expected).abs().max() <= 1e-5
    assert (ref[mask] - expected).abs().max() <= 1e-5  # the reference starts as the policy


def test_sampler_log_probs_on_some_groups_only_line_up_with_their_samples() -> None:
    """Old log-probs given for one group of a micro-batch: the others keep the detached policy's."""
    batch = micro_batch()
    plain = learner("shared_prompt", kl_beta=0.0)
    base = plain.train_groups(batch)["loss_sum"]
    # the policy's own log-probs of group 1 as its sampler's: nothing changes
    own = learner("shared_prompt", kl_beta=0.0)
    logp, mask, _, _, _ = own._logprobs(batch)
    start = len(batch[0].completions)
    rows = [logp[start + i, : len(c)].tolist() for i, c in enumerate(batch[1].completions)]
    given = [batch[0], TrainGroup(batch[1].prompt, batch[1].completions, batch[1].rewards, rows), *batch[2:]]
    own.model.zero_grad(set_to_none=True)
    assert own.train_groups(given)["loss_sum"] == pytest.approx(base, abs=1e-5)
    # shifted old log-probs of group 1 alone change the loss: the rows are really read
    shifted = [[v - 0.5 for v in row] for row in rows]
    moved = [
        batch[0],
        TrainGroup(batch[1].prompt, batch[1].completions, batch[1].rewards, shifted),
        *batch[2:],
    ]
    other = learner("shared_prompt", kl_beta=0.0).train_groups(moved)["loss_sum"]
    assert abs(other - base) > 1e-3


def test_an_empty_micro_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="empty micro-batch"):
        learner("shared_prompt").train_groups([])


@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_at_a_temperature_the_engine_samples_the_log_probs_the_learner_reads(packing: str) -> None:
    """At T = 0.7 (and top-p 0.9) the built-in engine's sampling log-probs are the learner's before any
    step: both of softmax(logits / T), whatever the packing; neither is the untempered one."""
    from cadence.model.engine import SamplingParams, TorchEngine

    cfg = CONFIGS["qwen3"]
    params = SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9)
    engine = TorchEngine(init_model(cfg, seed=5), eos_id=2)
    groups, sampled = [], []
    for i, (prompt, _) in enumerate(make_groups(4)):
        completions = engine.generate(prompt, [10 * i + s for s in range(4)], params)
        groups.append(TrainGroup(prompt, [c.tokens for c in completions], [float(s) for s in range(4)]))
        sampled += [torch.tensor(c.logprobs) for c in completions]
    tempered = TorchLearner(
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-3,
        0.0,
        0.2,
        0.28,
        0.0,
        1.0,
        packing,
        temperature=0.7,
    )
    logp, mask, _, _, _ = tempered._logprobs(groups)
    want = torch.cat(sampled)
    assert int(mask.sum()) == want.numel()
    assert (logp[mask].detach() - want).abs().max() <= 1e-5
    untempered = learner(packing, kl_beta=0.0)._logprobs(groups)[0]
    assert (untempered[mask].detach() - want).abs().max() > 1e-2


@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_the_entropy_is_of_the_tempered_policy_at_every_trained_token(packing: str) -> None:
    """The learner's entropy sum, taken from the logits the loss already has, against the entropy of
    softmax(logits / T) of a full forward over every group, at the response tokens only."""
    temperature = 0.7
    cfg = CONFIGS["qwen3"]
    own = TorchLearner(
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-3,
        0.0,
        0.2,
        0.28,
        0.0,
        1.0,
        packing,
        temperature=0.7,
    )
    stats = own.train_groups(micro_batch())
    want = 0.0
    with torch.no_grad():
        for g in micro_batch():
            for c in g.completions:
                logits = own.model(torch.tensor([g.prompt + c]))[0, len(g.prompt) - 1 : -1] / temperature
                p = torch.softmax(logits.double(), -1)
                want += float(-(p * torch.log(p)).sum())
    assert stats["entropy_sum"] == pytest.approx(want, rel=1e-5)
    info = own.step(stats["tokens"])
    assert info["entropy"] == pytest.approx(want / stats["tokens"], rel=1e-4)
    assert 0.0 <= info["clip_fraction"] <= 1.0 and info["lr"] == 1e-3


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e3, 0.0])
def test_the_step_divides_and_clips_as_clip_grad_norm_does(max_grad_norm: float) -> None:
    """One multiply of each gradient by min(1, max / (norm + 1e-6)) / normaliser: the gradients and
    norm of dividing, then `clip_grad_norm_` (clipping or not; 0: no limit)."""
    a, b = learner("shared_prompt"), learner("shared_prompt")
    a.max_grad_norm = max_grad_norm
    for x in (a, b):
        x.train_groups(micro_batch())
    for p in b.model.parameters():
        p.grad.div_(7.0)  # type: ignore[union-attr]
    expected_norm = torch.nn.utils.clip_grad_norm_(list(b.model.parameters()), max_grad_norm or float("inf"))
    assert 1e-3 < float(expected_norm) < 1e3  # clipped at 1e-3, left alone at 1e3
    got_norm = a._normalise_and_clip(7.0)
    torch.testing.assert_close(got_norm, expected_norm, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(grads(a), grads(b), rtol=1e-5, atol=1e-9)


def precise(packing: str, precision: str) -> TorchLearner:
    cfg = CONFIGS["qwen3"]
    model = init_model(cfg, seed=5)
    return TorchLearner(
        model, cfg, CharTokenizer(), 1e-3, 0.0, 0.2, 0.28, 0.1, 1.0, packing=packing, precision=precision
    )


@pytest.mark.parametrize("packing", ["shared_prompt", "prefix_cache", "padded"])
def test_bf16_log_probs_are_float32_within_a_stated_tolerance_of_fp32(packing: str) -> None:
    """bf16 autocast rounds each matmul's inputs to 8 bits of mantissa: on this small model the
    log-probs stay within 0.05 nats of fp32 (a bf16 ulp at 1 is 0.0078), and they come out float32."""
    fp32, bf16 = precise(packing, "fp32"), precise(packing, "bf16")
    exact, mask, exact_ref, _, _ = fp32._logprobs(micro_batch())
    rounded, same_mask, rounded_ref, _, _ = bf16._logprobs(micro_batch())
    assert rounded.dtype == torch.float32 and torch.equal(mask, same_mask)
    assert exact_ref is not None and rounded_ref is not None
    for a, b in ((exact, rounded), (exact_ref, rounded_ref)):
        gap = (a[mask].detach() - b[mask].detach()).abs().max()
        assert 0 < gap <= 0.05  # rounded (not fp32 in disguise), and close


def test_bf16_keeps_float32_weights_gradients_and_optimizer_state_and_moves_like_fp32() -> None:
    fp32, bf16 = precise("shared_prompt", "fp32"), precise("shared_prompt", "bf16")
    for own in (fp32, bf16):
        own.train_groups(micro_batch())
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in bf16.model.parameters())  # fmt: skip
    cosine = torch.nn.functional.cosine_similarity(grads(fp32), grads(bf16), dim=0)
    assert cosine > 0.99
    for own in (fp32, bf16):
        own.step(normaliser=10.0)
    state = [s for st in bf16.optimizer.state.values() for s in st.values() if torch.is_tensor(s) and s.dim()]
    assert state and all(s.dtype == torch.float32 for s in state)


def test_a_precision_other_than_fp32_or_bf16_is_refused() -> None:
    with pytest.raises(ValueError, match="trainer.precision must be one of"):
        precise("padded", "fp16")
