"""`cadence data reasoning-gym`: problems of a reasoning-gym generator written as JSONL for the file task.

Each line is one JSON object with `question` and `answer` (the file task's default fields), so
`task.name = "file"` reads the file with no further settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cadence.tasks.gym import generate


def export_reasoning_gym(
    name: str,
    size: int,
    seed: int,
    out: Path,
    options: dict[str, Any] | None = None,
    unique: bool = False,
) -> int:
    """Write `size` problems of generator `name` (seeded, with its own `options`) to `out`; the count.

    With `unique`, a question already written is skipped, so a held-out split of the file (the
    file task's `eval.prompts`) never repeats a training problem; fewer than `size` lines are then
    written when the generator has fewer distinct problems.
    """
    dataset = generate(name, size, seed, options)
    seen: set[str] = set()
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i in range(len(dataset)):
            entry = dataset[i]
            question = str(entry["question"])
            if unique and question in seen:
                continue
            seen.add(question)
            f.write(json.dumps({"question": question, "answer": str(entry["answer"])}) + "\n")
            written += 1
    return written
