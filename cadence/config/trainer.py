"""The trainer's section of a run's configuration (`[trainer]`, `[trainer.gspo]`): its optimizer and
schedule, the policy loss, how groups are packed, its ranks and device, what it does when lost.

Invariant: as in `sections.py`, every field has a default, a description and its rule if it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cadence.config.fields import AUTOMATIC_THREADS, NOT_NEGATIVE, POSITIVE, SHARE, Rule, doc, section

CLIP_LOW = Rule(ge=0, lt=1)  # 1 - clip_low stays a positive ratio


@dataclass(frozen=True)
class GspoConfig:
    """GSPO's own clip range (`trainer.objective = "gspo"`): it clips a sequence-level ratio, the
    geometric mean of the token ratios, which stays much closer to 1 than a token's."""

    clip_low: float = doc(3e-4, "lower clip bound of the sequence ratio: s >= 1 - clip_low", CLIP_LOW)
    clip_high: float = doc(4e-4, "upper clip bound of the sequence ratio: s <= 1 + clip_high", NOT_NEGATIVE)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """A correction for the gap between the engine that samples and the learner that trains
    (docs/objectives.md): a detached weight on each sampled token's surrogate term from the ratio
    rho = pi_learner / pi_engine, of the token, of the sample (the product) or their geometric mean;
    off by default (the loss as without it, bit for bit)."""

    mode: Literal["off", "truncate", "mask"] = doc(
        "off",
        "off; truncate: weight min(rho, cap) (truncated importance sampling, TIS); mask: weight rho inside"
        " [low, high] and 0 outside (masked importance sampling, IcePop)",
    )
    level: Literal["token", "sequence", "geometric"] = doc(
        "token",
        "which rho: each token's own, the product of a sample's token ratios, or their geometric mean"
        " (one weight for every token of the sample)",
    )
    cap: float = doc(2.0, "truncate: the largest weight", Rule(ge=1, finite=True, why="rho = 1 must keep 1"))
    low: float = doc(0.5, "mask: the band's lower end", Rule(gt=0, le=1))
    high: float = doc(2.0, "mask: the band's upper end", Rule(ge=1, finite=True, why="rho = 1 must be kept"))


@dataclass(frozen=True)
class MismatchConfig:
    """What the trainer reports of the gap between the engine's log-probs and its own on the sampled
    tokens (always measured, from the forward it trains with: `mismatch_*` in metrics.jsonl)."""

    bound: float = doc(
        2.0, "a token ratio pi_learner / pi_engine outside [1 / bound, bound] counts as beyond", Rule(gt=1)
    )
    warn_kl: float = doc(
        0.01,
        "a period whose mismatch_kl (token mean of k3) exceeds it logs a mismatch_high warning, at most once"
        " every 10 periods; 0 never",
        NOT_NEGATIVE,
    )


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (docs/lora.md): with a rank above 0 the policy's base weights are frozen, each
    target projection learns W + alpha/rank x B A (B zero at the start, so the first version is the
    base), the optimizer holds the adapters alone, and a version is the adapters' bytes alone."""

    rank: int = doc(0, "the adapters' rank r; 0: no adapters, every weight is trained", NOT_NEGATIVE)
    alpha: float = doc(32.0, "the adapters' scale is alpha / rank", Rule(gt=0, finite=True))
    dropout: float = doc(0.0, "dropout on an adapter's input while training", Rule(ge=0, lt=1))
    targets: list[str] = doc(
        list(LORA_TARGETS),
        "the projections given adapters, by their Hugging Face names: q_proj, k_proj, v_proj, o_proj,"
        " gate_proj, up_proj, down_proj",
    )
    base_dtype: Literal["float32", "bfloat16"] = doc(
        "float32",
        "how the learner holds the adapted projections' frozen base weights: float32, or bfloat16 (half"
        " their bytes, the reference's too; needs trainer.precision = 'bf16', whose autocast rounds them"
        " to bfloat16 in every product anyway, so the loss and gradients are the same)",
    )
    apply: Literal["merge", "step"] = doc(
        "merge",
        "how the built-in engine applies a version: merge (W + alpha/rank x B A into its copy of the base"
        " on load, then steps at the base's cost) or step (the low-rank products in every step; a load"
        " copies A and B alone)",
    )


@dataclass(frozen=True)
class TrainerConfig:
    """The trainer: its optimizer and schedule, the policy loss, how groups are packed, its ranks and
    device, and what it does when lost."""

    learner: Literal["torch", "simulated"] = doc(
        "torch", "what trains: the real model or a timed stand-in (bench)"
    )
    lr: float = doc(1e-3, "AdamW learning rate (the peak, with a schedule)", Rule(gt=0, finite=True))
    lr_schedule: Literal["constant", "linear", "cosine"] = doc(
        "constant",
        "learning rate after the warmup, stepped once per optimizer step: constant, or decaying linearly"
        " or along a half cosine from lr towards lr x min_lr_ratio, the run's last step one step short of"
        " it (Hugging Face's schedules); a resumed run continues it exactly",
    )
    warmup_periods: int = doc(
        0,
        "periods over which the learning rate rises linearly from lr / warmup steps to lr (at most periods)",
        NOT_NEGATIVE,
    )
    min_lr_ratio: float = doc(
        0.0, "linear and cosine schedules: the share of lr the rate decays towards after the warmup", SHARE
    )
    weight_decay: float = doc(0.0, "AdamW weight decay")
    objective: Literal["dapo", "grpo", "dr_grpo", "gspo"] = doc(
        "dapo",
        "the policy loss (docs/objectives.md): dapo (token-level sum over the step's batch / its tokens),"
        " grpo (each sample's token-mean, averaged over samples), dr_grpo (no std scaling of advantages,"
        " / max_new_tokens x samples), gspo (sequence-level ratio and clip, settings in [trainer.gspo])",
    )
    clip_low: float = doc(0.2, "lower clip bound of a token's ratio: r >= 1 - clip_low (not gspo)", CLIP_LOW)
    clip_high: float = doc(
        0.28,
        "upper clip bound of a token's ratio: r <= 1 + clip_high (not gspo); 0.28 is DAPO's clip-higher,"
        " trainer.clip_high = 0.2 gives the original GRPO's symmetric clip [0.8, 1.2] (with clip_low 0.2)",
        NOT_NEGATIVE,
    )
    gspo: GspoConfig = section(GspoConfig, "the gspo objective's clip range")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig,
        "weights correcting for the gap between the engine's log-probs and the learner's",
    )
    mismatch: MismatchConfig = section(MismatchConfig, "what is reported of the engine-learner gap")
    lora: LoraConfig = section(LoraConfig, "low-rank adapters instead of training every weight")
    kl_beta: float = doc(
        0.0,
        "weight of the k3 KL penalty to the frozen reference (the starting policy); 0 skips the reference",
    )
    packing: Literal["shared_prompt", "prefix_cache", "padded"] = doc(
        "shared_prompt",
        "how a micro-batch's log-probs are computed: shared_prompt (its groups in one row, the beginning"
        " their prompts share computed once, bool mask), prefix_cache (the prompt once through the KV"
        " cache, then the responses as a batch) or padded (each sample its own row); all three give the"
        " same log-probs and gradients, to float rounding",
    )
    activation_checkpointing: bool = doc(
        False,
        "keep only each transformer block's input for the backward and compute the block again there:"
        " the activations held fall from every block's to about one block's (plus an input a block) at"
        " the cost of one more forward; the gradients are those without it; packing shared_prompt or"
        " padded",
    )
    micro_batch_tokens: int = doc(
        4096,
        "packed tokens a forward may hold: groups that arrive while the trainer is busy are trained"
        " together up to this budget (a larger group alone); 0 trains each group on its own",
        NOT_NEGATIVE,
    )
    steps_per_period: int = doc(
        1,
        "optimizer steps a period (dividing task.prompts_per_period), each after B/steps groups; above 1"
        " the old-policy log-probs are the engine's sampling log-probs, and later steps train on slightly"
        " off-policy samples",
        Rule(ge=1),
    )
    max_grad_norm: float = doc(1.0, "gradient norm clip applied after normalising; 0 disables")
    threads: int = doc(
        0,
        "torch threads of each trainer rank; 0: automatic, in sync mode this host's cores divided by the"
        " ranks (workers idle while it trains), in periodic mode the cores the workers' threads leave"
        " until the period's last group is in, then every core divided by the ranks",
        AUTOMATIC_THREADS,
    )
    normaliser: Literal["tokens", "samples"] = doc(
        "tokens",
        "dapo: each step's summed loss is divided by its response tokens or its samples (the other"
        " objectives fix their own)",
    )
    checkpoint_every: int = doc(
        0, "save a resumable checkpoint every N periods (0: only the final weights)", NOT_NEGATIVE
    )
    on_loss: Literal["fail", "wait"] = doc(
        "fail",
        "when the trainer (or its publisher) is lost: fail the run, or wait with the workers held until a"
        " trainer resumed from its checkpoint (`cadence trainer --resume`) registers again; wait needs"
        " trainer.checkpoint_every > 0",
    )
    ranks: int = doc(
        1,
        "data-parallel ranks of the trainer: each trains its share of every micro-batch and the gradients"
        " are summed before the step; above 1 the trainer runs under torchrun (`cadence run` starts it so)",
        Rule(ge=1),
    )
    sharding: Literal["none", "fsdp2"] = doc(
        "none",
        "how the ranks hold the policy: none (each the whole model and AdamW state, gradients all-reduced"
        " at the step) or fsdp2 (torch's fully_shard per transformer block: parameters, gradients and"
        " AdamW state split over the ranks; needs trainer.ranks > 1 and packing = 'shared_prompt')",
    )
    device: Literal["cpu", "cuda", "npu"] = doc(
        "cpu",
        "where the trainer computes: cpu (collectives over gloo), cuda (each rank its LOCAL_RANK GPU, nccl)"
        " or npu (Ascend through torch_npu, hccl)",
    )
    collective_timeout_s: float = doc(
        300.0,
        "seconds a rank waits in one collective (or an idle follower for its next command) before it"
        " fails naming the rank",
        POSITIVE,
    )
    precision: Literal["fp32", "bf16"] = doc(
        "fp32",
        "the forward and backward (the reference's too): fp32, or bf16 autocast with float32 master"
        " weights, gradients and AdamW state, and the log-probs' softmax and the loss in float32",
    )
