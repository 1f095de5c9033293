"""The eval rounds at the dispatcher: which prompt of which round is pending, outstanding at which
worker, or answered.

An eval round evaluates one version on the whole eval set (`cadence.tasks.heldout`): every prompt is
pending, then outstanding at one worker, then answered; the round's row (`eval_figures`, and for
episodes `eval_episodes`) is written to `eval.jsonl` once every prompt is answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from cadence.monitor.evaluation import eval_episodes, eval_figures
from cadence.monitor.samples import turns_of
from cadence.tasks.base import Prompt
from cadence.wire.messages import EvalResult

log = structlog.get_logger()


@dataclass
class EvalRound:
    """The eval set for weights `version`: pending, outstanding at a peer, or answered."""

    version: int
    pending: deque[Prompt]
    started: float
    outstanding: dict[int, tuple[bytes, Prompt]] = field(default_factory=dict)
    answers: dict[int, tuple[Prompt, EvalResult]] = field(default_factory=dict)

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

    def answer(self, answer: EvalResult) -> None:
        """Take the answer to an outstanding prompt."""
        _, prompt = self.outstanding.pop(answer.prompt_id)
        self.answers[answer.prompt_id] = (prompt, answer)

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
        these weights, or the run's end for the final version); for episodes also their figures, as
        `cadence eval` gives them (none for single-turn answers)."""
        answers = [answer for _, (_, answer) in sorted(self.answers.items(), reverse=True)]
        figures = eval_figures([(a.rewards, a.correct) for a in answers], k)
        row = {"period": self.version, "version": self.version, **figures, "eval_s": now - self.started}
        return row | eval_episodes([a.episodes for a in answers])

    def samples(self) -> list[dict[str, Any]]:
        """Every answered prompt with its responses, in eval-set order (ids -1, -2, ...)."""
        out = []
        for pid, (prompt, answer) in sorted(self.answers.items(), reverse=True):
            responses = [
                {"text": t, "reward": r, "correct": c}
                for t, r, c in zip(answer.responses, answer.rewards, answer.correct, strict=True)
            ]
            transcripts = answer.episodes.transcripts if answer.episodes is not None else []
            for response, transcript in zip(responses, transcripts, strict=False):
                response["messages"] = turns_of(transcript)  # an episode's turns
            out.append(
                {
                    "version": self.version,
                    "prompt_id": pid,
                    "prompt": prompt.text,
                    "answer": prompt.answer,
                    "reward_mean": sum(answer.rewards) / len(answer.rewards),
                    "responses": responses,
                }
            )
        return out


class EvalRounds:
    """The dispatcher's open eval rounds, oldest first: which are due, which prompt goes to which
    worker, which answers to take, and when a round is complete or must be abandoned.

    A round of version v is handed out at the tail of period v, once its training prompts are all
    assigned, to the workers then holding v. What the tail could not hold when version v + 1 is
    announced is the round's rest: it goes out before period v + 1's prompts (`behind`), to workers
    still holding v, so a round always completes and the next period waits only for that rest. A round
    not answered by version v + `keep_versions` (the versions the publisher holds; a worker lost with
    its prompts) is abandoned.

    `every`: the versions evaluated (multiples of it, and `periods`; 0: none); `samples`: samples an eval
    prompt."""

    def __init__(
        self, eval_set: Sequence[Prompt], every: int, periods: int, samples: int, keep_versions: int
    ) -> None:
        self.eval_set = list(eval_set)
        self.every = every
        self.periods = periods
        self.samples = samples
        self.keep_versions = keep_versions
        self.open: list[EvalRound] = []

    def due(self, version: int) -> bool:
        every = self.every
        return bool(self.eval_set) and every > 0 and (version % every == 0 or version == self.periods)

    def announce(self, version: int, now: float) -> None:
        """Version `version` is published: abandon the rounds too old to finish, open its own if due."""
        self._abandon([r for r in self.open if r.version + self.keep_versions <= version])
        for r in self.open:
            if r.pending and r.version < version:
                log.info("eval_rest_first", version=r.version, prompts=len(r.pending), next_version=version)
        if self.due(version) and all(r.version != version for r in self.open):
            self.open.append(EvalRound(version, deque(self.eval_set), now))
            log.info("eval_started", version=version, prompts=len(self.eval_set))

    def close_before(self, version: int) -> None:
        """Abandon the rounds of versions before `version` (the run has ended: only the final round,
        of the weights saved, is waited for)."""
        self._abandon([r for r in self.open if r.version < version])

    def _abandon(self, rounds: list[EvalRound]) -> None:
        for r in rounds:
            log.warning(
                "eval_abandoned", version=r.version, answered=len(r.answers), prompts=len(self.eval_set)
            )
            self.open.remove(r)

    @property
    def pending(self) -> bool:
        return any(r.pending for r in self.open)

    def behind(self, newest: int) -> bool:
        """A round older than version `newest` (the newest announced) still has prompts to hand out:
        they go before that period's prompts."""
        return any(r.pending and r.version < newest for r in self.open)

    def give(self, peer: bytes, credits: int, newest: int) -> list[tuple[EvalRound, Prompt]]:
        """Up to `credits` pending prompts for `peer`, one batch of one version: the oldest round's
        with prompts left, of version `newest` or before."""
        r = next((r for r in self.open if r.pending and r.version <= newest), None)
        return [] if r is None else [(r, p) for p in r.give(peer, credits)]

    def problem(self, peer: bytes, version: int, prompt_id: int) -> str | None:
        """Why an answer to eval prompt `prompt_id` of `version` from `peer` may not be taken, or None."""
        if not any(r.version == version and r.held_by(peer, prompt_id) for r in self.open):
            return f"no eval prompt {prompt_id} of version {version} was given to this worker"
        return None

    def answer(self, answer: EvalResult, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """Take an answer `problem` found nothing wrong with; the row and samples of the round it
        completes, or None."""
        r = next(r for r in self.open if r.version == answer.version)
        r.answer(answer)
        if not r.complete:
            return None
        self.open.remove(r)
        return r.row(self.samples, now), r.samples()

    def requeue(self, peer: bytes) -> None:
        for r in self.open:
            r.requeue(peer)
