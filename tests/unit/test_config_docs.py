"""The configuration's reference page: generated from the fields, checked in as docs/config.md."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from cadence.cli import main
from cadence.config import RunConfig
from cadence.config.checks import ACROSS
from cadence.config.reference import reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of the configuration, by its dotted name."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += dotted_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def test_the_checked_in_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == reference(), "docs/config.md is out of date: run `make config-docs`"


def test_every_key_section_and_rule_across_keys_is_on_the_page() -> None:
    page = reference()
    keys = dotted_keys(RunConfig)
    assert len(keys) > 100
    assert all(f"| `{key}` |" in page for key in keys)
    assert "## `[trainer.gspo]`" in page and "## `[transport]`" in page
    assert all(f"- `{rule.__name__}`: " in page for rule in ACROSS)


def test_a_row_shows_type_default_range_and_description() -> None:
    page = reference()
    assert "| `trainer.lr` | float | `0.001` | finite and positive | AdamW learning rate" in page
    assert "| `rollout.threads` | int | `0` | >= 0 (0: automatic) |" in page
    assert '| `mode` | `"periodic"` or `"sync"` | `"periodic"` |  |' in page
    assert "| `weights.chunk_bytes` | int | `4194304` (4 MiB) | positive |" in page


def test_the_command_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    assert main(["config", "docs", "-o", str(out)]) == 0
    assert out.read_text() == reference()
