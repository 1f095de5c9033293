"""Each actor's settings and session, read from the `RunConfig` here and nowhere else.

Invariant: an actor sees only the values its settings name; every process of a run derives them
from the same config by these functions, so the dispatcher, trainer and workers agree on the
periods, the batch and the policy for a lost trainer.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Coroutine
from typing import Any

from cadence.actors.publisher import PublisherSettings
from cadence.actors.rollout import WorkerSettings
from cadence.config import RunConfig
from cadence.dispatch.settings import DispatcherSettings
from cadence.launch.build import model_positions, version_figures
from cadence.launch.threads import (
    rollout_threads,
    rollout_threads_alone,
    trainer_threads,
    trainer_threads_alone,
)
from cadence.log import LogStream
from cadence.monitor.logstream import LogBounds, stream_logs
from cadence.training.filters import Filters
from cadence.training.selection import SelectionRule
from cadence.training.steps import StepRule
from cadence.training.trainer_settings import TrainerSettings
from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.transport.session import Session
from cadence.wire.meaning import GroupBounds


def liveness(cfg: RunConfig, clock: Callable[[], float]) -> Liveness:
    """Heartbeats every `transport.heartbeat_s`; a peer is lost after `transport.liveness` of them."""
    return Liveness(cfg.transport.heartbeat_s, cfg.transport.liveness, clock)


def session(
    cfg: RunConfig,
    dispatcher: Client,
    role: str,
    clock: Callable[[], float],
    address: str = "",
    local: str = "",
    secret: str = "",
    stream: LogStream | None = None,
) -> Session:
    """The session of actor `role` (serving at `address`, and at the ipc:// `local` for peers on its
    host) with the dispatcher behind `dispatcher`; a trainer's or publisher's shows the run's `secret`;
    with `stream`, the process's log lines go to the dispatcher on it."""
    beside = None
    if stream is not None:

        def beside() -> Coroutine[Any, Any, None]:
            return stream_logs(dispatcher, stream)

    return Session(
        dispatcher,
        role,
        liveness(cfg, clock),
        address,
        local=local,
        secret=secret,
        beside=beside,
        first_contact_s=cfg.transport.first_contact_s,
    )


def log_bounds(cfg: RunConfig) -> LogBounds:
    """What the dispatcher's log hub takes of streamed lines, in bytes."""
    m = cfg.monitor
    return LogBounds(m.log_line_bytes, m.log_batch_bytes, m.log_actor_bytes, m.log_run_bytes)


def dispatcher_settings(cfg: RunConfig) -> DispatcherSettings:
    return DispatcherSettings(
        periods=cfg.periods,
        prompts_per_period=cfg.task.prompts_per_period,
        group_size=cfg.rollout.group_size,
        on_trainer_loss=cfg.trainer.on_loss,
        wait_for_workers_s=cfg.rollout.wait_for_workers_s,
        eval_every=cfg.eval.every,
        eval_samples=1 if cfg.eval.greedy else cfg.eval.k,
        keep_versions=cfg.weights.keep_versions,
        oversample=cfg.sampling.extra(cfg.task.prompts_per_period),
        stream=cfg.sampling.issued_at_most(cfg.task.prompts_per_period),
        max_credits=cfg.rollout.inflight,
        hold_s=cfg.rollout.hold_s,
        hold_floor_s=20 * cfg.transport.liveness_timeout_s,
        hold_idle_floor_s=cfg.transport.liveness_timeout_s,
    )


def trainer_settings(cfg: RunConfig, vocab_size: int) -> TrainerSettings:
    """`vocab_size`: the model's token ids (`launch/build.py` `vocab_limit`); a group with others is refused."""
    t = cfg.trainer
    return TrainerSettings(
        periods=cfg.periods,
        prompts_per_period=cfg.task.prompts_per_period,
        mode=cfg.mode,
        micro_batch_tokens=t.micro_batch_tokens,
        checkpoint_every=t.checkpoint_every,
        bounds=group_bounds(cfg, vocab_size),
        steps=step_rule(cfg),
        threads=trainer_threads(cfg),
        threads_alone=trainer_threads_alone(cfg),
        publish_dtype=publish_dtype(cfg),
        sampling=selection_rule(cfg),
        mismatch_warn_kl=t.mismatch.warn_kl,
        trainable_params=version_figures(cfg)[0],
    )


TEXT_CHARS_A_TOKEN = 64  # a token's text is rarely longer; a text beyond 64 characters a token is refused


def group_bounds(cfg: RunConfig, vocab_size: int) -> GroupBounds:
    """What a group of this run may hold: `vocab_size` token ids (the model's), `rollout.group_size`
    samples, completions within the worker's token limit (an episode's: `environment.max_tokens`) and,
    with the prompt, within the model's positions; texts within 64 characters a token of that limit.
    An agent's episode may be several rows, one a sequence: at most one an answer its calls could have
    had (`environment.max_turns` x `environment.max_choices`), each within the model's positions only
    (a rewritten sequence's own beginning is part of its row)."""
    limit = token_limit(cfg)
    positions = model_positions(cfg)
    e = cfg.environment
    return GroupBounds(
        vocab_size=vocab_size,
        samples=cfg.rollout.group_size,
        completion_tokens=0 if e.agent else limit,
        positions=positions,
        text_chars=TEXT_CHARS_A_TOKEN * max(limit, positions),
        rows=e.max_turns * e.max_choices if e.agent else 1,
    )


def selection_rule(cfg: RunConfig) -> SelectionRule:
    """Which of a period's groups the trainer trains, and in which order (`[sampling]`; a user's filter
    imported now, so a name that does not load fails the start)."""
    s = cfg.sampling
    if not s.on:
        return SelectionRule(order=s.order)
    stream = s.issued_at_most(cfg.task.prompts_per_period)
    return SelectionRule(stream, s.order, Filters.of(s.filters, s.reward_range))


def step_rule(cfg: RunConfig) -> StepRule:
    """Each optimizer step's normaliser and rate: the objective's, and the schedule's."""
    t = cfg.trainer
    return StepRule(
        objective=t.objective,
        normaliser=t.normaliser,
        # dr_grpo's constant: the longest a sample's sampled tokens may be (an episode's: its budget)
        max_sampled_tokens=token_limit(cfg),
        steps_per_period=t.steps_per_period,
        periods=cfg.periods,
        lr=t.lr,
        lr_schedule=t.lr_schedule,
        warmup_periods=t.warmup_periods,
        min_lr_ratio=t.min_lr_ratio,
    )


def token_limit(cfg: RunConfig) -> int:
    """The most tokens a sample's completion may hold: `rollout.max_new_tokens`, or an episode's
    `environment.max_tokens`."""
    return cfg.environment.max_tokens if cfg.environment.played else cfg.rollout.max_new_tokens


def publish_dtype(cfg: RunConfig) -> str | None:
    """The dtype versions are published in: the built-in engine's when it rounds them (half the bytes
    to serialise, send and load, and a worker computes with them as they arrive); otherwise the
    learner's own. A broadcast sends the learner's tensors, which the worker rounds on load."""
    rounded = cfg.rollout.engine == "torch" and cfg.rollout.dtype != "float32"
    return cfg.rollout.dtype if rounded else None


def worker_settings(cfg: RunConfig) -> WorkerSettings:
    return WorkerSettings(
        seed=cfg.seed,
        inflight=cfg.rollout.inflight,
        samples_fraction=cfg.monitor.samples_fraction,
        weights_transport=cfg.weights.transport,
        broadcast_timeout_s=cfg.weights.broadcast_timeout_s,
        on_trainer_loss=cfg.trainer.on_loss,
        threads=rollout_threads(cfg),
        threads_alone=rollout_threads_alone(cfg),
        trainer_beside=cfg.mode == "periodic",
        host=socket.gethostname(),
        share_weights=cfg.weights.share_on_host,
        join=cfg.rollout.join == "on"
        or (cfg.rollout.join == "auto" and (cfg.rollout.workers > 1 or cfg.sampling.order == "prompt")),
    )


def publisher_settings(cfg: RunConfig) -> PublisherSettings:
    """Uploads held to `weights.max_upload_bytes`, and freed when silent for a liveness timeout."""
    return PublisherSettings(
        max_upload_bytes=cfg.weights.max_upload_bytes,
        upload_timeout_s=cfg.transport.liveness_timeout_s,
    )
