"""The file task: problems read from a JSONL or Parquet file, walked in a seeded order, epoch by epoch.

Prompt k of the run (k = period * count + index) is record perm_e[k mod n] where e = k // n and perm_e
is a permutation of the n records seeded by (run seed, e): consecutive periods take consecutive
slices, every record is seen once an epoch, and any actor can regenerate any period.
Invariant: reward = format_weight * (finished and an answer was stated)
+ (1 - format_weight) * correct, in 0..1; correctness is `cadence.tasks.answers.is_correct`, or
math-verify's with `task.checker = "math_verify"` (`cadence.tasks.verify`).
"""

from __future__ import annotations

import functools
import json
import random
import string
from pathlib import Path
from typing import Any

from cadence.config import TaskConfig
from cadence.tasks.answers import extract_answer
from cadence.tasks.base import Prompt, Score
from cadence.tasks.verify import check_answer

# what a char tokenizer must hold beyond the data, so "\boxed{...}" or "answer is" can be written
MATH_CHARACTERS = string.digits + string.ascii_letters + "+-*/=^()[]{}<>.,:;!?%$\\_|'\" \n"


@functools.lru_cache(maxsize=8)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"records/{seed}/{epoch}").shuffle(order)
    return tuple(order)


def walk(size: int, seed: int, period: int, count: int) -> list[int]:
    """Indices of the `count` records of `period` in a run over `size` records (see the docstring)."""
    if size <= 0:
        raise ValueError("cannot walk an empty dataset")
    out = []
    for position in range(period * count, (period + 1) * count):
        epoch, offset = divmod(position, size)
        out.append(_permutation(size, seed, epoch)[offset])
    return out


def check_held_out(held_out: int, size: int) -> int:
    """`held_out` records of `size` kept from training, leaving at least one to train on."""
    if not 0 <= held_out < size:
        raise ValueError(
            f"eval.prompts = {held_out} holds out the last records from training, and the task has"
            f" {size}: at least one must be left to train on"
        )
    return held_out


def alphabet_of(texts: list[str]) -> str:
    """Every character of `texts`, digits, letters and math punctuation, once each, in a fixed order."""
    return "".join(sorted(set(MATH_CHARACTERS).union(*texts)))


def records_alphabet(records: list[tuple[str, str]]) -> str:
    """The alphabet of a task over `records` (prompt, answer): `alphabet_of` their texts."""
    return alphabet_of([text + answer for text, answer in records])


def templated(template: str, rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(prompt, answer) rows, each prompt set in `template` (task.prompt_template: `{prompt}` replaced)."""
    return [(template.replace("{prompt}", question), answer) for question, answer in rows]


def file_records(cfg: TaskConfig) -> list[tuple[str, str]]:
    """The file task's records: (prompt, answer) of every record of `task.path`, set in the template."""
    return templated(cfg.prompt_template, read_records(cfg.path, cfg.prompt_field, cfg.answer_field))


def record_prompts(
    records: list[tuple[str, str]], held_out: int, seed: int, period: int, count: int
) -> list[Prompt]:
    """The `count` prompts of `period` of a task over `records`, its last `held_out` left out: the
    records `walk` picks, with the ids `period * count + index`."""
    indices = walk(len(records) - held_out, seed, period, count)
    return [Prompt(period * count + i, *records[r]) for i, r in enumerate(indices)]


def stated_reward(format_weight: float, finished: bool, response: str, correct: bool) -> float:
    """format_weight for a finished response that states an answer, the rest for a correct one."""
    stated = finished and extract_answer(response) is not None
    return format_weight * stated + (1.0 - format_weight) * correct


class FileTask:
    """`held_out`: the last that many records are the eval set's (`cadence.tasks.heldout`); training
    walks the others only."""

    def __init__(self, cfg: TaskConfig, seed: int, held_out: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.records = file_records(cfg)
        self.alphabet = records_alphabet(self.records)
        self.held_out = check_held_out(held_out, len(self.records))

    def prompts(self, period: int, count: int) -> list[Prompt]:
        return record_prompts(self.records, self.held_out, self.seed, period, count)

    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        correct = check_answer(response, answer, self.cfg.checker)
        reward = stated_reward(self.cfg.format_weight, finished, response, correct)
        return Score(reward=reward, correct=float(correct))


def read_records(path: str, prompt_field: str, answer_field: str) -> list[tuple[str, str]]:
    """(prompt, answer) of every record of a .jsonl or .parquet file; a clear ValueError otherwise."""
    if not path:
        raise ValueError("task.path is empty; the file task reads a .jsonl or .parquet file")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"task.path {path!r}: no such file")
    fields = [(prompt_field, "task.prompt_field"), (answer_field, "task.answer_field")]
    if file.suffix == ".jsonl":
        rows = _jsonl_rows(file)
        where = "line"
    elif file.suffix == ".parquet":
        rows = _parquet_rows(file, fields)
        where = "row"
    else:
        raise ValueError(f"task.path {path!r}: unknown extension {file.suffix!r}; use .jsonl or .parquet")
    records = []
    for number, row in rows:
        values = []
        for name, key in fields:
            if name not in row or row[name] is None:
                missing = "no" if name not in row else "a null"
                raise ValueError(
                    f"{file} {where} {number}: {missing} field {name!r} ({key});"
                    f" fields there: {', '.join(sorted(row)) or 'none'}"
                )
            values.append(str(row[name]))
        records.append((values[0], values[1]))
    if not records:
        raise ValueError(f"task.path {path!r}: the file holds no records")
    return records


def _jsonl_rows(file: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file} line {number}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{file} line {number}: a JSON object expected, got {type(row).__name__}")
            rows.append((number, row))
    return rows


def _parquet_rows(file: Path, fields: list[tuple[str, str]]) -> list[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"task.path {str(file)!r}: reading Parquet needs pyarrow (pip install 'cadence[data]')"
        ) from None
    table = pq.read_table(file)
    for name, key in fields:
        if name not in table.column_names:
            raise ValueError(
                f"{file} row 0: no field {name!r} ({key}); columns: {', '.join(table.column_names)}"
            )
    table = table.select(list(dict.fromkeys(name for name, _ in fields)))
    return list(enumerate(table.to_pylist()))
