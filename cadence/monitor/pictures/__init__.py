"""Pictures of a run directory: `cadence timeline` (who works when) and `cadence plot` (curves a period).

Invariant: nothing here imports matplotlib when the package loads, so the `cadence` command stays
instant; the drawing functions import it when called, draw on their own `Figure` with a
non-interactive canvas, and never touch pyplot's global state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadence.monitor.run_dir import read_new_lines

FORMATS = (".png", ".svg", ".pdf")


class PictureError(Exception):
    """A run directory or an output path that a picture cannot be drawn from; the message says why."""


def picture_format(out: Path) -> str:
    """The file format named by the suffix of `out` (png, svg or pdf)."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise PictureError(f"cannot tell the picture format of {out}: use a file name ending in .png or .svg")
    return suffix[1:]


def check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise PictureError(f"no run folder {run_dir}")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The period rows of `run_dir/metrics.jsonl`, in file order; an unfinished last line is skipped."""
    return read_new_lines(run_dir / "metrics.jsonl", 0)[0]


def write_picture(draw: Callable[[], Path]) -> int:
    """Run `draw`, print what it wrote, and turn a missing input or matplotlib into exit code 1."""
    try:
        out = draw()
    except PictureError as err:
        print(f"cadence: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:
        if err.name != "matplotlib":
            raise
        print("cadence: pictures need matplotlib: pip install 'cadence[plot]'", file=sys.stderr)
        return 1
    print(f"cadence: wrote {out}")
    return 0
