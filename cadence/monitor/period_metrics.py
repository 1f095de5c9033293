"""One period's figures as a typed row: what the trainer measures, the dispatcher records in
`metrics.jsonl`, the summary sums and the progress line shows.

Invariant: `to_row` gives the very keys and values `metrics.jsonl` has always had (a reward
function's mean as `reward_<name>`, lists for the per-group figures, `workers` and `reassigned` only
once the dispatcher has added them), and `from_row(row).to_row() == row` for every row it wrote.
An episode figure (`turns_mean`, `tool_calls`, ...: a run with `environment.name`) is left out of a
row while None, and the episodes by ending are written as `ended_<ending>`, so a single-turn run's
rows keep exactly their keys. `from_row` takes rows of older runs and resume checkpoints as they are: a missing key gets its
default (0, an empty list or string), an unknown key is kept in `extra` and written back unchanged,
so nothing a trainer sent is lost. Values are taken as they are, not converted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# fields whose rows hold lists
_SEQUENCES = ("group_arrival_s", "micro_batch_train_s")
# fields left out of a row while None: the dispatcher's, and a multi-turn run's episode figures
_RECORDED = ("workers", "reassigned", "prompts_issued", "groups_stopped")
# fields of an over-sampled run (`[sampling]`), left out of a row while None
_SAMPLING = ("groups_filtered", "groups_arrived", "tokens_filtered", "reward_kept_mean")
_EPISODES = (
    "turns_mean",
    "tool_calls",
    "tool_errors",
    "env_timeouts",
    "env_s",
    "env_wall_s",
    "env_tokens",
    "turn_reward_mean",
    "sequences_mean",
    "sequences_max",
    "rewrites",
    "rewrite_share",
    "call_tokens_mean",
    "call_s_mean",
)
# the gap between the engine's log-probs and the learner's (ops/mismatch.py) and its correction's
# figures, left out of a row while None (nothing measured; no correction)
_MISMATCH = (
    "mismatch_kl",
    "mismatch_ratio_mean",
    "mismatch_ratio_min",
    "mismatch_ratio_max",
    "mismatch_beyond_token_share",
    "mismatch_beyond_sample_share",
    "correction_weight",
    "correction_zeroed",
)
# fields left out of a row while None: which transport each worker's version came by
_TRANSPORTS = ("weights_from",)
# fields that are no key of the row themselves
_NOT_KEYS = ("reward_functions", "endings", "filtered", "extra")


@dataclass(frozen=True)
class PeriodMetrics:
    """The figures of period `period`; times in seconds on the trainer's clock from the period's start."""

    period: int = 0  # the period (= the weights version its rollouts were generated with)
    version: int = 0  # the weights version the period trained from (the period itself)
    groups: int = 0  # prompt groups trained
    samples: int = 0  # completions of the groups arrived (trained, and filtered or stopped ones)
    reward_mean: float = 0.0  # mean reward of the samples
    reward_std: float = 0.0  # standard deviation of the samples' rewards
    accuracy: float = 0.0  # share of the samples judged correct
    response_len_mean: float = 0.0  # mean completion length in tokens
    response_len_max: int = 0  # longest completion in tokens
    tokens_generated: int = 0  # completion tokens of the period
    tokens_trained: int = 0  # sampled tokens that reached a loss term (a sample of advantage 0 does
    # not, unless a KL term holds it; an environment's never do)
    tokens_kept: int = 0  # sampled tokens of the groups kept for training, computed or not
    tokens_computed: int = (
        0  # packed tokens the forwards and backwards took (distinct samples of advantage ≠ 0)
    )
    period_s: float = 0.0  # from this version's publication to the next one's
    gen_s: float = 0.0  # from the period's start to the last group's arrival
    train_s: float = 0.0  # training micro-batches and optimizer steps, summed
    overlap_s: float = 0.0  # training while groups were still arriving
    tail_s: float = 0.0  # from the last trained group's arrival to the start of publishing
    trainer_idle_s: float = 0.0  # period_s - train_s - publish_s
    inference_idle_s: float = 0.0  # a rollout worker's time neither generating nor loading, mean
    publish_s: float = 0.0  # publishing the next version
    weight_load_s: float = 0.0  # the slowest worker's load of this version
    weight_sync_s: float = 0.0  # publish_s + weight_load_s
    weights_from: dict[str, str] | None = None  # worker -> how its version came (shm, zmq, gloo...);
    # left out of a row while None (no worker said)
    version_bytes: int = 0  # bytes of the version published at the period's end ([trainer.lora]: adapters)
    trainable_params: int = 0  # parameters the optimizer moves (every weight, or the adapters alone)
    tokens_per_s: float = 0.0  # tokens_generated / period_s
    samples_per_s: float = 0.0  # samples / period_s
    stale_dropped: int = 0  # groups refused as generated with another version's weights
    duplicates_dropped: int = 0  # groups refused as already trained
    workers_active: int = 0  # rollout workers whose groups arrived
    group_arrival_s: tuple[float, ...] = ()  # each group's arrival, from the period's start
    micro_batches: int = 0  # micro-batches trained
    micro_batch_train_s: tuple[float, ...] = ()  # each micro-batch's training time
    forward_backward_s: float = 0.0  # the micro-batches' forward and backward: train_s without the steps
    step_s: float = 0.0  # optimizer steps, summed
    entropy: float | None = (
        0.0  # mean entropy of the tempered policy over the computed tokens (steps' mean); None: none computed
    )
    clip_fraction: float = 0.0  # share of trained tokens whose clip is active for their advantage's sign
    kl: float = 0.0  # mean k3 KL to the reference a trained token (0 without a reference)
    lr: float = 0.0  # learning rate of the period's last optimizer step
    mismatch_kl: float | None = None  # token mean of k3 = rho - 1 - log rho, rho = pi_learner / pi_engine
    mismatch_ratio_mean: float | None = None  # token mean of rho
    mismatch_ratio_min: float | None = None  # the smallest rho of a sampled token
    mismatch_ratio_max: float | None = None  # the largest
    mismatch_beyond_token_share: float | None = None  # share of tokens with rho beyond [1/bound, bound]
    mismatch_beyond_sample_share: float | None = None  # share of samples with such a token
    correction_weight: float | None = None  # rollout correction: mean weight a computed token
    correction_zeroed: float | None = None  # rollout correction: share of computed tokens masked out
    samples_sha256: str = ""  # checksum of every generated token, independent of arrival order
    reward_functions: dict[str, float] = field(default_factory=dict)  # function -> mean (reward_<name>)
    turns_mean: float | None = None  # model turns an episode, mean (None: a single-turn run)
    tool_calls: int | None = None  # tool calls of the period's episodes
    tool_errors: int | None = None  # of which the tool answered with an error
    env_timeouts: int | None = None  # environment calls cut at environment.step_timeout_s
    env_s: float | None = None  # seconds in the environment's calls, each episode's, summed over them
    env_wall_s: float | None = None  # wall seconds in which any environment call ran, summed over the
    # workers' batches (episodes that wait at once count once here, each in env_s)
    env_tokens: int | None = None  # the environment's tokens in the completions (context, never trained)
    turn_reward_mean: float | None = None  # the turns' own rewards (`Reply.reward`), mean over those given
    endings: dict[str, int] = field(default_factory=dict)  # episodes by why they ended (ended_<ending>)
    sequences_mean: float | None = None  # agent episodes: token sequences an episode, mean
    sequences_max: int | None = None  # agent episodes: the most token sequences an episode had
    rewrites: int | None = None  # agent episodes of more than one sequence (a rewritten history, or n > 1)
    rewrite_share: float | None = None  # agent episodes: the share of them of more than one sequence
    call_tokens_mean: float | None = None  # agent episodes: tokens a call sampled, mean
    call_s_mean: float | None = None  # agent episodes: seconds a call took at the endpoint, mean
    workers: int | None = None  # rollout workers registered when recorded (the dispatcher's)
    reassigned: int | None = None  # prompts handed to another worker so far (the dispatcher's)
    prompts_issued: int | None = None  # over-sampled: prompts the period queued, refills included
    groups_stopped: int | None = None  # over-sampled: issued prompts neither trained nor filtered
    groups_arrived: int | None = None  # over-sampled: groups that reached the trainer
    groups_filtered: int | None = None  # over-sampled: groups a filter threw away (never trained)
    tokens_filtered: int | None = None  # over-sampled: sampled tokens of groups that arrived untrained
    reward_kept_mean: float | None = None  # over-sampled: mean reward of the trained groups' samples
    filtered: dict[str, int] = field(default_factory=dict)  # groups by the filter that threw them away
    extra: dict[str, Any] = field(default_factory=dict)  # keys of a row this class does not know

    def to_row(self) -> dict[str, Any]:
        """The `metrics.jsonl` line (and `VersionReady.metrics`) of these figures."""
        row: dict[str, Any] = dict(self.extra)
        row.update({f"reward_{name}": value for name, value in self.reward_functions.items()})
        row.update({f"ended_{ending}": count for ending, count in self.endings.items()})
        row.update({f"filtered_{reason}": count for reason, count in self.filtered.items()})
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_KEYS or (
                f.name in _RECORDED + _EPISODES + _SAMPLING + _MISMATCH + _TRANSPORTS and value is None
            ):
                continue
            row[f.name] = list(value) if f.name in _SEQUENCES else value
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PeriodMetrics:
        """The figures of a row, from this run or an older one (see the module's invariant)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(_NOT_KEYS)
        values: dict[str, Any] = {}
        functions: dict[str, float] = {}
        endings: dict[str, int] = {}
        filtered: dict[str, int] = {}
        extra: dict[str, Any] = {}
        for key, value in row.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key in known:
                values[key] = tuple(value) if key in _SEQUENCES else value
            elif key.startswith("reward_") and number:
                functions[key.removeprefix("reward_")] = value
            elif key.startswith("ended_") and isinstance(value, int) and not isinstance(value, bool):
                endings[key.removeprefix("ended_")] = value
            elif key.startswith("filtered_") and isinstance(value, int) and not isinstance(value, bool):
                filtered[key.removeprefix("filtered_")] = value
            else:
                extra[key] = value
        values.setdefault("version", values.get("period", 0))
        return cls(**values, reward_functions=functions, endings=endings, filtered=filtered, extra=extra)
