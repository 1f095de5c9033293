"""Rollout samples for people to read: a share of each period's groups, written to
`samples/period-K.jsonl` (prompt, answer, every response with its reward and correctness; an
episode's also with every turn and who wrote it, its figures and why it ended). Like log lines, they
give way on a full disk: a group the disk refuses is dropped and counted, never raised into the trainer.

Invariant: whether a group is kept depends only on (seed, prompt id, fraction), so the worker that
attaches the texts and anyone re-reading the run agree without talking; a kept group is one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import structlog

from cadence.monitor.run_dir import append_all, disk_full
from cadence.wire.messages import GroupResult
from cadence.wire.rows import per_sample

log = structlog.get_logger()


def is_sampled(seed: int, prompt_id: int, fraction: float) -> bool:
    """True for about `fraction` of prompt ids, the same ones every time for a seed."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.sha256(f"samples/{seed}/{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class SampleWriter:
    """Appends kept groups to `<dir>/period-K.jsonl`, one file a period."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.dropped = 0  # groups a full disk refused

    def write(self, period: int, record: dict[str, Any]) -> None:
        """Append `record` as one line; on a full disk it is dropped and counted (said once), and no
        part of it stays in the file."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                self.directory / f"period-{period}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
            )
            try:
                size = os.fstat(fd).st_size
                try:
                    append_all(fd, data)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)  # a part of the line: gone again
                    raise
            finally:
                os.close(fd)
        except OSError as err:
            if not disk_full(err):
                raise
            self.dropped += 1
            if self.dropped == 1:
                log.warning("samples_dropped", directory=str(self.directory), error=str(err))

    def drop_from(self, period: int) -> None:
        """Remove the files of periods >= `period` (they are generated again after a resume)."""
        for path in self.directory.glob("period-*.jsonl"):
            if (
                path.stem.removeprefix("period-").isdigit()
                and int(path.stem.removeprefix("period-")) >= period
            ):
                path.unlink(missing_ok=True)


def turns_of(transcript: list[str]) -> list[dict[str, str]]:
    """An episode's messages with who wrote each: the first message and every other after it the
    environment's, the rest the model's (`GroupResult.transcripts`)."""
    return [
        {"author": "model" if i % 2 else "environment", "text": text} for i, text in enumerate(transcript)
    ]


def sample_record(msg: GroupResult, filtered: str | None = None) -> dict[str, Any]:
    """The samples line of a kept group (one whose worker attached its texts): each response with its
    length, reward, correctness and reward parts; an episode's also with its turns, figures and ending.
    `filtered`: why the group was not trained (a filter's name, or "stopped"), recorded with it."""
    responses = []
    lengths = per_sample([len(c) for c in msg.completions], msg.episode_of, len(msg.rewards))
    for i, (text, tokens, reward, correct) in enumerate(
        zip(msg.responses, lengths, msg.rewards, msg.correct, strict=True)
    ):
        response = {"text": text, "tokens": tokens, "reward": reward, "correct": correct}
        response |= {name: values[i] for name, values in msg.reward_parts.items()}
        response |= _episode_record(msg, i)
        responses.append(response)
    return {
        "period": msg.period,
        "version": msg.version,
        "prompt_id": msg.prompt_id,
        "prompt": msg.prompt,
        "answer": msg.answer,
        "reward_mean": sum(msg.rewards) / len(msg.rewards),
        "responses": responses,
    } | ({"filtered": filtered} if filtered is not None else {})


def _episode_record(msg: GroupResult, i: int) -> dict[str, Any]:
    """The figures, turn rewards and messages of the group's episode `i` (nothing for a single-turn
    group)."""
    figures = msg.episodes
    if figures is None:
        return {}
    record: dict[str, Any] = {}
    if figures.turns:
        record |= {
            "turns": figures.turns[i],
            "ended": figures.endings[i] if figures.endings else "",
            "tool_calls": figures.tool_calls[i] if figures.tool_calls else 0,
            "tool_errors": figures.tool_errors[i] if figures.tool_errors else 0,
            "env_tokens": figures.env_tokens[i] if figures.env_tokens else 0,
        }
    if figures.sequences:
        record |= {
            "sequences": figures.sequences[i],
            "call_tokens": figures.call_tokens[i],
            "call_s": figures.call_s[i],
        }
    if figures.turn_rewards:
        record["turn_rewards"] = figures.turn_rewards[i]
    if figures.transcripts:
        record["messages"] = turns_of(figures.transcripts[i])
    return record
