"""Per-period figures from the trainer's own observations: arrivals, training spans, sync times.

Invariant: every time figure is measured on the trainer's clock from the period's start (the moment
version k was published), so overlap and idle time add up: period_s = train_s + idle_s + publish_s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from cadence.monitor.episode_figures import episode_metrics
from cadence.monitor.mismatch import period_mismatch
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.wire.messages import EpisodeFigures, GroupResult
from cadence.wire.rows import per_sample


def overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Total length of `spans` inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def serial_finish(start: float, arrivals: list[float], costs: list[float]) -> float:
    """When a serial trainer that takes each group as it arrives (in order) would be done."""
    t = start
    for arrival, cost in sorted(zip(arrivals, costs, strict=True)):
        t = max(t, arrival) + cost
    return t


@dataclass
class PeriodStats:
    """What the trainer saw of one period. Every group that arrives counts in the policy's figures
    (rewards, lengths, times); only the kept ones in what was trained (`groups`, `tokens_kept`, the
    samples' checksum, the tail). `oversampled`: the run has `[sampling]` on, and its rows say what was
    filtered and stopped."""

    period: int
    start: float
    oversampled: bool = False
    arrivals: list[float] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)  # one per trained micro-batch
    rewards: list[float] = field(default_factory=list)
    correct: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    workers: set[str] = field(default_factory=set)
    busy: dict[str, float] = field(default_factory=dict)  # worker -> seconds generating and loading
    weights_from: dict[str, str] = field(default_factory=dict)  # worker -> how its version came
    parts: dict[str, list[float]] = field(default_factory=dict)  # reward function -> values
    stale_dropped: int = 0
    duplicates_dropped: int = 0
    step_s: float = 0.0  # optimizer steps of the period, summed
    steps: list[dict[str, float]] = field(default_factory=list)  # each optimizer step's statistics

    completions: dict[int, list[list[int]]] = field(default_factory=dict)  # the trained groups'
    played: list[EpisodeFigures] = field(default_factory=list)  # accepted groups' episode figures
    kept_arrivals: list[float] = field(default_factory=list)  # each trained group's arrival
    kept_rewards: list[float] = field(default_factory=list)
    kept_tokens: int = 0  # the trained groups' sampled tokens
    filtered: dict[str, int] = field(default_factory=dict)  # groups by the filter that threw them away
    dropped_tokens: int = 0  # sampled tokens of the groups that arrived and were not trained
    stopped: int = 0  # groups that arrived after their period closed (prompt order), never trained

    def arrived(self, now: float, sender: str, group: GroupResult, kept: bool = True) -> None:
        """`group`, accepted at `now` from `sender`: its samples, rewards, times and, for episodes,
        figures (`monitor/episode_figures.py`) count in the period's figures; `kept`: it is trained
        (else `kept`, `filtered_out` or `stopped_after_close` says so once the selection has)."""
        self.arrivals.append(now)
        self.busy[sender] = self.busy.get(sender, 0.0) + group.gen_s + group.load_s
        if group.weights_from:
            self.weights_from[sender] = group.weights_from
        for name, values in group.reward_parts.items():
            self.parts.setdefault(name, []).extend(values)
        own = [len(c) for c in group.completions]
        self.lengths.extend(per_sample(own, group.episode_of, len(group.rewards)))  # an episode's rows
        self.workers.add(sender)
        self.rewards.extend(group.rewards)
        self.correct.extend(group.correct)
        self.gen_s.append(group.gen_s)
        self.load_s.append(group.load_s)
        if group.episodes is not None and group.episodes.turns:
            self.played.append(group.episodes)
        if kept:
            self.kept(now, group)

    def kept(self, now: float, group: GroupResult) -> None:
        """`group`, arrived at `now`, is trained."""
        self.kept_arrivals.append(now)
        self.kept_rewards.extend(group.rewards)
        self.completions[group.prompt_id] = group.completions
        self.kept_tokens += sampled(group)

    def filtered_out(self, group: GroupResult, reason: str) -> None:
        """`group` arrived and filter `reason` threw it away."""
        self.filtered[reason] = self.filtered.get(reason, 0) + 1
        self.dropped_tokens += sampled(group)

    def stopped_after_close(self, group: GroupResult) -> None:
        """`group` arrived, but its period closed before its turn came (prompt order)."""
        self.stopped += 1
        self.dropped_tokens += sampled(group)

    def stepped(self, info: dict[str, float]) -> None:
        """An optimizer step of the period was taken; `info`: the learner's statistics of it."""
        self.steps.append(info)

    def _selection(self) -> dict[str, Any]:
        """An over-sampled period's figures of what was kept, filtered and stopped (none otherwise)."""
        if not self.oversampled:
            return {}
        kept = self.kept_rewards
        return {
            "groups_arrived": len(self.arrivals),
            "groups_filtered": sum(self.filtered.values()),
            "tokens_filtered": self.dropped_tokens,
            "reward_kept_mean": sum(kept) / len(kept) if kept else 0.0,
            "filtered": dict(sorted(self.filtered.items())),
        }

    def _gap(self) -> dict[str, Any]:
        """The engine-learner gap's figures (monitor/mismatch.py) and a rollout correction's, the
        steps' means (none where nothing was measured, or without a correction)."""
        keys = ("correction_weight", "correction_zeroed")
        figures: dict[str, Any] = period_mismatch(self.steps)
        return figures | {key: self._mean_of_steps(key) for key in keys if any(key in s for s in self.steps)}

    def _mean_of_steps(self, key: str) -> float:
        values = [info[key] for info in self.steps if key in info]
        return sum(values) / len(values) if values else 0.0

    def finish(self, end: float, publish_s: float) -> PeriodMetrics:
        """The figures of this period; `end` is when the next version was published."""
        period_s = end - self.start
        last_arrival = max(self.arrivals) if self.arrivals else self.start
        last_kept = max(self.kept_arrivals) if self.kept_arrivals else self.start
        group_train = [b - a for a, b in self.spans]
        train_s = sum(group_train) + self.step_s
        n = len(self.rewards)
        mean = sum(self.rewards) / n if n else 0.0
        std = (sum((r - mean) ** 2 for r in self.rewards) / n) ** 0.5 if n else 0.0
        played = episode_metrics(self.played)
        tokens = sum(self.lengths) - played.get("env_tokens", 0)  # the sampled ones
        idle = [max(0.0, period_s - busy) for busy in self.busy.values()]
        return PeriodMetrics(
            period=self.period,
            version=self.period,
            groups=len(self.kept_arrivals),
            samples=n,
            reward_mean=mean,
            reward_std=std,
            accuracy=sum(self.correct) / n if n else 0.0,
            response_len_mean=sum(self.lengths) / n if n else 0.0,
            response_len_max=max(self.lengths, default=0),
            tokens_generated=tokens,
            tokens_trained=int(sum(info.get("loss_tokens", 0) for info in self.steps)),
            tokens_kept=self.kept_tokens,
            tokens_computed=int(sum(info.get("computed_tokens", 0) for info in self.steps)),
            period_s=period_s,
            gen_s=last_arrival - self.start,
            train_s=train_s,
            overlap_s=overlap(self.spans, self.start, last_arrival),
            tail_s=end - publish_s - last_kept,
            trainer_idle_s=period_s - train_s - publish_s,
            inference_idle_s=sum(idle) / len(idle) if idle else 0.0,
            publish_s=publish_s,
            weight_load_s=max(self.load_s, default=0.0),
            weight_sync_s=publish_s + max(self.load_s, default=0.0),
            weights_from=dict(sorted(self.weights_from.items())) or None,
            tokens_per_s=tokens / period_s if period_s > 0 else 0.0,
            samples_per_s=n / period_s if period_s > 0 else 0.0,
            stale_dropped=self.stale_dropped,
            duplicates_dropped=self.duplicates_dropped,
            workers_active=len(self.workers),
            group_arrival_s=tuple(round(a - self.start, 6) for a in self.arrivals),
            micro_batches=len(self.spans),
            micro_batch_train_s=tuple(round(c, 6) for c in group_train),
            forward_backward_s=sum(group_train),
            step_s=self.step_s,
            samples_sha256=samples_digest(self.completions),
            reward_functions={name: sum(v) / len(v) for name, v in sorted(self.parts.items()) if v},
            entropy=self._mean_of_steps("entropy") if any("entropy" in info for info in self.steps) else None,
            clip_fraction=self._mean_of_steps("clip_fraction"),
            kl=self._mean_of_steps("kl"),
            lr=self.steps[-1].get("lr", 0.0) if self.steps else 0.0,
            **self._gap(),
            **self._selection(),
            **played,
        )


def sampled(group: GroupResult) -> int:
    """The tokens the model sampled in `group` (an episode's environment tokens are not)."""
    if group.masks:
        return sum(sum(mask) for mask in group.masks)
    return sum(len(c) for c in group.completions)


def samples_digest(completions: dict[int, list[list[int]]]) -> str:
    """One checksum of every generated token of a period, independent of arrival order."""
    h = hashlib.sha256()
    for prompt_id in sorted(completions):
        h.update(json.dumps([prompt_id, completions[prompt_id]]).encode())
    return h.hexdigest()
