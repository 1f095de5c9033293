"""Resume checkpoints: all a trainer needs to continue a run exactly where it stood.

```
 checkpoints/asked                        a resume checkpoint asked for after the current period
                                          (`cadence slurm`, before a time limit); "stop": and no period
                                          after it (`cadence slurm stop`); removed once written
 checkpoints/resume/   state.json         version (= the next period), seed, run id, the config keys
                                          that must match to continue (with their sha256), and the
                                          metrics row of the period before (a kill may come before the
                                          dispatcher records it)
                       model.safetensors  ┐
                       optimizer.pt       ├ the learner's `save_state`
                       rng.pt             ┘
```

Prompts are a pure function of (task config, seed, period) and sampling seeds of (seed, period,
prompt id, sample index), and the learning rate of a step of (period, step, run shape:
ops/schedule.py), so the version is the whole data and schedule position: a run continued from version k
regenerates exactly what it would have generated without the interruption.

Invariant: a kill at any moment leaves a complete checkpoint (the old or the new one). A checkpoint is
written into `resume.tmp/`, every file fsynced, `state.json` last; then `resume/` is renamed to
`resume.old/`, `resume.tmp/` to `resume/`, and `resume.old/` removed. Between the two renames only
`resume.old/` exists, and `find_resume` takes it; a leftover `resume.tmp/` is never read, and the next
save removes it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cadence.config import RunConfig, to_dict

if TYPE_CHECKING:
    from cadence.training.learner import Learner

NAME = "resume"
STATE = "state.json"
ASKED = "asked"
"""A file in the checkpoint folder asking for a resume checkpoint after the current period, whatever
`trainer.checkpoint_every` says; removed once it is written (`cadence slurm`, before a time limit)."""
# what may differ between the saved run and its continuation: how the run is carried out or how
# long it lasts, not what it computes (keys, and sections by their prefix)
FREE_KEYS = {
    "periods",
    "run_id",
    "mode",
    "trainer.checkpoint_every",
    "trainer.on_loss",
    "trainer.ranks",
    "trainer.sharding",
    "trainer.device",
    "trainer.collective_timeout_s",
    "rollout.workers",
    "rollout.inflight",
}
FREE_SECTIONS = ("monitor.", "transport.", "weights.", "simulated.")


class ResumeError(RuntimeError):
    """No checkpoint to resume from, or one that does not fit the configuration."""


@dataclass(frozen=True)
class RunRecord:
    """What a resume checkpoint records of its run and a continuation is checked against: the seed,
    the run id, the periods, and the config keys a continuation must share (`must_match`). What the
    trainer is given in place of the whole configuration."""

    seed: int
    run_id: str
    periods: int
    config: dict[str, Any]

    @classmethod
    def of(cls, cfg: RunConfig) -> RunRecord:
        return cls(cfg.seed, cfg.run_id, cfg.periods, must_match(cfg))

    @property
    def config_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.config, sort_keys=True).encode()).hexdigest()


def must_match(cfg: RunConfig) -> dict[str, Any]:
    """The config's keys, flattened to dotted names, that a continuation must share with the saver
    (`periods` too under a decaying learning rate schedule: the run's length shapes every rate)."""
    flat = _flatten(to_dict(cfg))
    free = FREE_KEYS - {"periods"} if cfg.trainer.lr_schedule != "constant" else FREE_KEYS
    return {k: v for k, v in flat.items() if k not in free and not k.startswith(FREE_SECTIONS)}


def save_resume(
    root: Path, learner: Learner, version: int, run: RunRecord, metrics: dict[str, Any] | None = None
) -> Path:
    """Write the learner's state as the resume checkpoint of `version` under `root`, with `metrics`, the
    row of the period before it; its folder."""
    final, tmp, old = root / NAME, root / f"{NAME}.tmp", root / f"{NAME}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_tmp(tmp, learner, version, run, metrics)
    except Exception as exc:  # a kill leaves resume.tmp/, which is never read and the next save removes
        shutil.rmtree(tmp, ignore_errors=True)  # never a half-written checkpoint left behind
        if _no_space(exc):
            raise ResumeError(
                f"no space left on the device of {root}: the resume checkpoint of period {version} was"
                " not written (the one before it is kept); free space and resume"
            ) from exc
        raise
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(root)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _no_space(exc: BaseException) -> bool:
    """A full disk, as an OSError or as torch's writer says it (its message holds the OS's words)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return isinstance(exc, OSError | RuntimeError) and "No space left" in str(exc)


def _write_tmp(
    tmp: Path, learner: Learner, version: int, run: RunRecord, metrics: dict[str, Any] | None
) -> None:
    """Every file of the checkpoint into `tmp`, fsynced, `state.json` last."""
    tmp.mkdir(parents=True)
    learner.save_state(tmp)
    state = {
        "version": version,
        "seed": run.seed,
        "run_id": run.run_id,
        "config": run.config,
        "config_sha256": run.config_sha256,
        "metrics": metrics or {},
        "saved_at": time.time(),
    }
    (tmp / STATE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    for path in sorted(tmp.iterdir()):
        _fsync(path)
    _fsync(tmp)


def find_resume(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The complete resume checkpoint under `root` and its state, or None; `ResumeError` naming the
    file when its `state.json` is empty or no JSON object."""
    for name in (NAME, f"{NAME}.old"):
        path = root / name / STATE
        if path.is_file():
            try:
                state = json.loads(path.read_text())
            except (ValueError, OSError) as exc:
                raise ResumeError(f"{path} is empty or damaged, not a resume state ({exc})") from None
            if not isinstance(state, dict) or not isinstance(state.get("version"), int):
                raise ResumeError(f"{path} is no resume state: it holds no version")
            return path.parent, state
    return None


def check_files(where: Path) -> None:
    """`ResumeError` naming the first file of the checkpoint in `where` that is empty or (weights) a
    truncated safetensors file; a missing one is named when the learner reads it."""
    for path in sorted(where.iterdir()):
        size = path.stat().st_size
        if path.is_file() and size == 0:
            raise ResumeError(f"{path} is empty: the resume checkpoint in {where} is damaged")
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                head = f.read(8)
            if len(head) < 8 or struct.unpack("<Q", head)[0] > size - 8:
                raise ResumeError(f"{path} is truncated or not safetensors ({size} bytes)")


def check_config(state: dict[str, Any], run: RunRecord, where: Path) -> None:
    """Raise `ResumeError` naming every key whose value differs from the checkpoint's."""
    saved, here = state.get("config", {}), run.config
    wrong = [
        f"{key} = {here.get(key)!r} here, {saved.get(key)!r} in the checkpoint"
        for key in sorted(saved.keys() | here.keys())
        if saved.get(key) != here.get(key)
    ]
    if wrong:
        raise ResumeError(
            f"the resume checkpoint in {where} was saved by another configuration: {'; '.join(wrong)}"
        )
    if state["version"] > run.periods:
        raise ResumeError(
            f"the resume checkpoint in {where} is at period {state['version']}, beyond periods = {run.periods}"
        )


def load_resume(root: Path, learner: Learner, run: RunRecord) -> dict[str, Any]:
    """Load the resume checkpoint under `root` into `learner`; its state (`version`: the period to
    continue from; `metrics`: the row of the period before it)."""
    found = find_resume(root)
    if found is None:
        raise ResumeError(
            f"no resume checkpoint in {root / NAME} (trainer.checkpoint_every = 0, or the run stopped"
            " before its first); start without --resume to begin at period 0"
        )
    where, state = found
    check_config(state, run, where)
    check_files(where)
    try:
        learner.load_state(where)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ResumeError(f"the resume checkpoint in {where} cannot be read: {exc}") from exc
    return state


def ask_for_checkpoint(root: Path, then_stop: bool = False) -> None:
    """Ask the trainer whose checkpoints are under `root` for a resume checkpoint after its current
    period (`then_stop`: and to train no further, so the run ends at that version); `checkpoint_asked(root)`
    holds until it is written."""
    (root / ASKED).write_text("stop\n" if then_stop else "asked\n")


def checkpoint_asked(root: Path) -> bool:
    return (root / ASKED).exists()


def stop_asked(root: Path) -> bool:
    """The ask under `root` is to stop after the checkpoint (`cadence slurm stop`)."""
    try:
        return (root / ASKED).read_text().strip() == "stop"
    except OSError:
        return False


def clear_checkpoint_ask(root: Path) -> None:
    """Remove the ask under `root`: the trainer's answer once the checkpoint is written, or an ask left
    by an earlier job."""
    (root / ASKED).unlink(missing_ok=True)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
