"""Held-out evaluation: the figures of an eval round, and the round's bookkeeping at the dispatcher.

An eval round evaluates one version on the whole eval set (`cadence.tasks.heldout`): every prompt is
pending, then outstanding at one worker, then answered; the round's row is written to `eval.jsonl`
once every prompt is answered. `cadence eval` computes the same figures with `eval_figures`.

Invariant: the figures depend only on each prompt's rewards and correctness values, not on the order
they came in; `eval_pass_at_k` is the unbiased estimator 1 - C(n - c, k) / C(n, k) averaged over the
prompts (n samples, c of them correct); with n = k it is the share of prompts with a correct sample.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cadence.tasks.base import Prompt


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, c of them correct, drawn without replacement hold a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_figures(groups: Sequence[tuple[Sequence[float], Sequence[float]]], k: int) -> dict[str, Any]:
    """`eval_reward` and `eval_accuracy` (means over every sample), `eval_pass_at_k` (mean over the
    prompts) of (rewards, correct) a prompt, with the counts they come from."""
    if not groups:
        raise ValueError("an eval round needs at least one prompt")
    rewards = [r for group, _ in groups for r in group]
    correct = [c for _, group in groups for c in group]
    passes = [pass_at_k(len(c), sum(1 for v in c if v >= 1.0), k) for _, c in groups]
    return {
        "eval_reward": sum(rewards) / len(rewards),
        "eval_accuracy": sum(correct) / len(correct),
        "eval_pass_at_k": sum(passes) / len(passes),
        "eval_k": k,
        "eval_prompts": len(groups),
        "eval_samples": len(rewards),
    }


@dataclass
class EvalRound:
    """The eval set for weights `version`: pending, outstanding at a peer, or answered."""

    version: int
    pending: deque[Prompt]
    started: float
    outstanding: dict[int, tuple[bytes, Prompt]] = field(default_factory=dict)
    answers: dict[int, tuple[Prompt, dict[str, Any]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.pending and not self.outstanding

    def give(self, peer: bytes, count: int) -> list[Prompt]:
        """Up to `count` pending prompts, now outstanding at `peer`."""
        given = [self.pending.popleft() for _ in range(min(count, len(self.pending)))]
        for prompt in given:
            self.outstanding[prompt.prompt_id] = (peer, prompt)
        return given

    def held_by(self, peer: bytes, prompt_id: int) -> bool:
        owner = self.outstanding.get(prompt_id)
        return owner is not None and owner[0] == peer

    def answer(self, prompt_id: int, record: dict[str, Any]) -> None:
        """Take the answer to an outstanding prompt: `record` has its `rewards` and `correct`."""
        _, prompt = self.outstanding.pop(prompt_id)
        self.answers[prompt_id] = (prompt, record)

    def requeue(self, peer: bytes) -> int:
        """What `peer` held goes back to the front of pending, in id order; how many."""
        back = sorted(
            (p for owner, p in self.outstanding.values() if owner == peer), key=lambda p: -p.prompt_id
        )
        for prompt in back:
            del self.outstanding[prompt.prompt_id]
        self.pending.extendleft(reversed(back))
        return len(back)

    def row(self, k: int, now: float) -> dict[str, Any]:
        """The `eval.jsonl` row of a complete round (`period` = `version`: the period that generates with
        these weights, or the run's end for the final version)."""
        groups = [
            (rec["rewards"], rec["correct"]) for _, (_, rec) in sorted(self.answers.items(), reverse=True)
        ]
        figures = eval_figures(groups, k)
        return {"period": self.version, "version": self.version, **figures, "eval_s": now - self.started}

    def samples(self) -> list[dict[str, Any]]:
        """Every answered prompt with its responses, in eval-set order (ids -1, -2, ...)."""
        out = []
        for pid, (prompt, rec) in sorted(self.answers.items(), reverse=True):
            responses = [
                {"text": t, "reward": r, "correct": c}
                for t, r, c in zip(rec["responses"], rec["rewards"], rec["correct"], strict=True)
            ]
            out.append(
                {
                    "version": self.version,
                    "prompt_id": pid,
                    "prompt": prompt.text,
                    "answer": prompt.answer,
                    "reward_mean": sum(rec["rewards"]) / len(rec["rewards"]),
                    "responses": responses,
                }
            )
        return out
