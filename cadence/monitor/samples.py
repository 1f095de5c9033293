"""Rollout samples for people to read: a share of each period's groups, written to
`samples/period-K.jsonl` (prompt, answer, every response with its reward and correctness).

Invariant: whether a group is kept depends only on (seed, prompt id, fraction), so the worker that
attaches the texts and anyone re-reading the run agree without talking; a kept group is one line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


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

    def write(self, period: int, record: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / f"period-{period}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def drop_from(self, period: int) -> None:
        """Remove the files of periods >= `period` (they are generated again after a resume)."""
        for path in self.directory.glob("period-*.jsonl"):
            if (
                path.stem.removeprefix("period-").isdigit()
                and int(path.stem.removeprefix("period-")) >= period
            ):
                path.unlink(missing_ok=True)
