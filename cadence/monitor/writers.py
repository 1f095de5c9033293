"""Optional copies of each period's metrics for the tools people already watch: TensorBoard event
files under `<run>/tensorboard/`, and Weights & Biases in offline mode under `<run>/wandb/`
(`wandb sync` uploads them later). Both are off by default and come with their extras.

Invariant: a writer gets every numeric field of every `metrics.jsonl` line, keyed by period, and the
`eval_*` figures of every `eval.jsonl` line, keyed by the period evaluated, and nothing else; a writer asked for but not installed stops the run at start, naming the extra.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from cadence.config import ConfigError, RunConfig, to_dict
from cadence.monitor.period_metrics import PeriodMetrics


class MetricWriter(Protocol):
    def write(self, step: int, metrics: PeriodMetrics) -> None: ...

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Figures beside a period's row (an eval round's)."""
        ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics line (lists, strings and booleans left out)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class TensorBoardWriter:
    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(
                "monitor.tensorboard needs the tensorboard package: pip install 'cadence[tensorboard]'"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(directory))

    def write(self, step: int, metrics: PeriodMetrics) -> None:
        self.scalars(step, scalars(metrics.to_row()))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"cadence/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    def __init__(self, directory: Path, cfg: RunConfig) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("monitor.wandb needs the wandb package: pip install 'cadence[wandb]'") from exc
        directory.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=cfg.monitor.wandb_project,
            name=cfg.run_id or None,
            dir=str(directory),
            mode="offline",
            config=to_dict(cfg),
        )

    def write(self, step: int, metrics: PeriodMetrics) -> None:
        self.run.log(scalars(metrics.to_row()), step=step)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def make_writers(cfg: RunConfig, out: Path) -> list[MetricWriter]:
    writers: list[MetricWriter] = []
    if cfg.monitor.tensorboard:
        writers.append(TensorBoardWriter(out / "tensorboard"))
    if cfg.monitor.wandb:
        writers.append(WandbWriter(out, cfg))
    return writers
