"""The run directory: `config.json`, `metrics.jsonl` (a line a period), `eval.jsonl` (a line an eval
round, with `samples/eval-period-K.jsonl`), `summary.json`.

Invariant: `metrics.jsonl` gets one line per finished period, flushed at once, and `summary.json`
is written atomically from those same lines, so the summary never disagrees with the metrics.
`eval.jsonl` gets one line per completed eval round, keyed by the `period` (= `version`) evaluated,
written when its last answer comes in (often after that period's metrics line).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadence.monitor.period_metrics import PeriodMetrics

if TYPE_CHECKING:
    from cadence.monitor.writers import MetricWriter


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, then a rename): a reader
    polling for the file never sees it empty or half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_new_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects on complete lines written to `path` after byte `offset`, and the offset after
    them; a line that is not a JSON object is skipped."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = []
    for line in data[:end].splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + end


def truncate_metrics(path: Path, version: int) -> int:
    """Drop the lines of periods >= `version` from a `metrics.jsonl` (atomically); how many went."""
    rows = read_jsonl(path)
    keep = [r for r in rows if r.get("period", -1) < version]
    if len(keep) < len(rows):
        write_whole(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    return len(rows) - len(keep)


class RunDirError(ValueError):
    """A run folder that cannot be recorded into as asked; the message names it, one line."""


def check_fresh(out: Path) -> None:
    """`RunDirError` when `out/metrics.jsonl` holds periods: a new run there would record them again
    (a run folder reused after a crash is continued with --resume, never started over in place)."""
    path = out / "metrics.jsonl"
    if path.is_file() and path.stat().st_size > 0:
        periods = len(read_new_lines(path, 0)[0])
        raise RunDirError(
            f"{path} holds {periods} periods of an earlier run: continue it with --resume (the dispatcher's"
            " and the trainer's), or give another --out; a period is never recorded twice"
        )


class RunRecorder:
    """Writes the per-period metrics and the run summary of one run directory; with `resume` it
    continues the `metrics.jsonl` already there, whose periods count in the summary; without, it
    refuses one that holds periods (`check_fresh`)."""

    def __init__(
        self, out: Path, mode: str, writers: Sequence[MetricWriter] = (), resume: bool = False
    ) -> None:
        if not resume:
            check_fresh(out)
        self.out = out
        self.writers = list(writers)
        self.mode = mode
        earlier = read_jsonl(out / "metrics.jsonl") if resume else []
        self.rows: list[PeriodMetrics] = [PeriodMetrics.from_row(r) for r in earlier]
        self.started = 0.0
        out.mkdir(parents=True, exist_ok=True)
        self._metrics = open(out / "metrics.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def start(self, now: float) -> None:
        self.started = now

    def period(self, metrics: PeriodMetrics) -> None:
        self.rows.append(metrics)
        self._metrics.write(json.dumps(metrics.to_row(), sort_keys=True) + "\n")
        for writer in self.writers:
            writer.write(metrics.period, metrics)

    def evaluation(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """Record a completed eval round: its `eval.jsonl` line, its samples (every prompt, each
        response) in `samples/eval-period-K.jsonl`, and its figures to the writers."""
        with (self.out / "eval.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        folder = self.out / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in samples)
        (folder / f"eval-period-{row['period']}.jsonl").write_text(text, encoding="utf-8")
        figures = {k: float(v) for k, v in row.items() if k.startswith("eval_")}
        for writer in self.writers:
            writer.scalars(int(row["period"]), figures)

    def rewind(self, version: int) -> int:
        """Forget the periods >= `version` (a trainer continues from it): the lines are dropped from
        `metrics.jsonl` too, so no period appears twice; how many went."""
        keep = [r for r in self.rows if r.period < version]
        if (self.out / "eval.jsonl").exists():  # the eval rounds of the versions after `version` run again
            truncate_metrics(self.out / "eval.jsonl", version + 1)
        if len(keep) == len(self.rows):
            return 0
        dropped, self.rows = len(self.rows) - len(keep), keep
        path = self.out / "metrics.jsonl"
        self._metrics.close()
        truncate_metrics(path, version)
        self._metrics = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        return dropped

    def finish(self, now: float, version: int, sha256: str, stopped: bool = False) -> dict[str, Any]:
        """Write `summary.json`; `stopped`: its user ended the run early (no final weights: `sha256` "")."""
        summary = summarize(self.rows, self.mode, now - self.started, version, sha256)
        if stopped:
            summary["stopped"] = True
        evals = read_jsonl(self.out / "eval.jsonl")
        if evals:  # the held-out figures before training (or the first round) and of the last round
            summary["eval_first"], summary["eval_last"] = evals[0], evals[-1]
        write_json(self.out / "summary.json", summary)
        self._metrics.close()
        for writer in self.writers:
            writer.close()
        return summary


def summarize(
    rows: Sequence[PeriodMetrics], mode: str, wall_s: float, version: int, sha256: str
) -> dict[str, Any]:
    """The run's figures from its period rows; first/last means are over a tenth of the periods."""
    n = len(rows)
    tenth = max(1, n // 10)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return {
        "mode": mode,
        "periods": n,
        "groups_trained": sum(r.groups for r in rows),
        "samples": sum(r.samples for r in rows),
        "tokens_generated": sum(r.tokens_generated for r in rows),
        "reward_mean_first": mean([r.reward_mean for r in rows[:tenth]]),
        "reward_mean_last": mean([r.reward_mean for r in rows[-tenth:]]),
        "accuracy_first": mean([r.accuracy for r in rows[:tenth]]),
        "accuracy_last": mean([r.accuracy for r in rows[-tenth:]]),
        "stale_dropped": sum(r.stale_dropped for r in rows),
        "duplicates_dropped": sum(r.duplicates_dropped for r in rows),
        "period_s_mean": mean([r.period_s for r in rows]),
        "overlap_s_total": sum(r.overlap_s for r in rows),
        "wall_s": wall_s,
        "final_version": version,
        "weights_sha256": sha256,
    }
