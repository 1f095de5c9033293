"""The run directory: `config.json`, `metrics.jsonl` (a line a period), `eval.jsonl` (a line an eval
round, with `samples/eval-period-K.jsonl`), `summary.json`.

Invariant: `metrics.jsonl` gets one line per finished period, flushed at once, and `summary.json`
is written atomically from those same lines, so the summary never disagrees with the metrics.
A full disk never tears a metrics line: the recorder keeps a small reserve (`.metrics-reserve`) that
it gives up for the row the disk refuses, then ends the run with `DiskFull` naming the folder (the
actors' log lines are dropped and counted before that, `cadence.log.FileSink`). A file written
whole (`write_whole`) is there whole or not at all, with no temporary file left either way.
`eval.jsonl` gets one line per completed eval round, keyed by the `period` (= `version`) evaluated,
written when its last answer comes in (often after that period's metrics line).
"""

from __future__ import annotations

import errno
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
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


class DiskFull(RunDirError):
    """The run folder's disk refused what the run must keep (its metrics, an eval round)."""


def disk_full(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


RESERVE_BYTES = 1 << 16
"""What the recorder keeps aside for the metrics row a full disk would refuse (rows are ~1 KiB)."""


def append_all(fd: int, data: bytes, done: int = 0) -> int:
    """Write `data[done:]` to `fd` until all of it is there; how much of `data` went out (on
    `OSError`, the count is on the exception's `written`)."""
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError as err:
        err.written = done  # type: ignore[attr-defined]
        raise
    return done


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
        self._metrics = os.open(out / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.reserve = out / ".metrics-reserve"
        self.reserve.write_bytes(os.urandom(RESERVE_BYTES))  # a disk already full: refused here, at the start

    def start(self, now: float) -> None:
        self.started = now

    def period(self, metrics: PeriodMetrics) -> None:
        self.rows.append(metrics)
        self._keep(f"period {metrics.period}", json.dumps(metrics.to_row(), sort_keys=True) + "\n")
        for writer in self.writers:
            writer.write(metrics.period, metrics)

    def _keep(self, what: str, line: str) -> None:
        """Append `line` to `metrics.jsonl` whole; the disk full: the reserve given up for it, then
        `DiskFull` (the line is there whole: the run ends with it)."""
        data = line.encode()
        try:
            append_all(self._metrics, data)
            return
        except OSError as err:
            if not disk_full(err):
                raise
            done = getattr(err, "written", 0)
        self.reserve.unlink(missing_ok=True)
        try:
            append_all(self._metrics, data, done)
        except OSError as err:
            raise DiskFull(f"the disk of {self.out} is full ({os.strerror(err.errno or 0)}): the row of"
                           f" {what} is not in metrics.jsonl; the run ends") from None  # fmt: skip
        raise DiskFull(
            f"the disk of {self.out} is full: the run ends after {what} (its row kept in metrics.jsonl,"
            f" {len(self.rows)} periods recorded)"
        )

    def evaluation(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """Record a completed eval round: its `eval.jsonl` line, its samples (every prompt, each
        response) in `samples/eval-period-K.jsonl`, and its figures to the writers; `DiskFull` when
        the disk refuses them."""
        try:
            self._evaluation(row, samples)
        except OSError as err:
            if not disk_full(err):
                raise
            raise DiskFull(f"the disk of {self.out} is full: the eval round of period {row['period']}"
                           " is not kept; the run ends") from None  # fmt: skip
        figures = {k: float(v) for k, v in row.items() if k.startswith("eval_")}
        for writer in self.writers:
            writer.scalars(int(row["period"]), figures)

    def _evaluation(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        with (self.out / "eval.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        folder = self.out / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in samples)
        (folder / f"eval-period-{row['period']}.jsonl").write_text(text, encoding="utf-8")

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
        os.close(self._metrics)
        truncate_metrics(path, version)  # a new file moved into place: opened again
        self._metrics = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return dropped

    def finish(self, now: float, version: int, sha256: str, stopped: bool = False) -> dict[str, Any]:
        """Write `summary.json`; `stopped`: its user ended the run early (no final weights: `sha256` "")."""
        summary = summarize(self.rows, self.mode, now - self.started, version, sha256)
        if stopped:
            summary["stopped"] = True
        evals = read_jsonl(self.out / "eval.jsonl")
        if evals:  # the held-out figures before training (or the first round) and of the last round
            summary["eval_first"], summary["eval_last"] = evals[0], evals[-1]
        try:
            write_json(self.out / "summary.json", summary)
        except OSError as err:
            if not disk_full(err):
                raise
            self.reserve.unlink(missing_ok=True)  # its room is the summary's
            write_json(self.out / "summary.json", summary)
        self.close()
        return summary

    def close(self) -> None:
        """The metrics file closed, its reserve given back, the writers closed (once)."""
        if self._metrics < 0:
            return
        os.close(self._metrics)
        self._metrics = -1
        self.reserve.unlink(missing_ok=True)
        for writer in self.writers:
            writer.close()


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
