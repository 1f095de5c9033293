"""`cadence bench generate`'s comparison of the built-in engine eager and compiled: a pure function of
the cases' lines."""

from __future__ import annotations

from typing import Any

from cadence.bench.generate import compiled_alike, samples_sha


def _line(engine: str, rows: int, sha: str | None) -> dict[str, Any]:
    line: dict[str, Any] = {
        "model": "tiny",
        "rows": rows,
        "dtype": "float32",
        "new_tokens": 6,
        "engine": engine,
    }
    if sha is not None:
        line["samples_sha"] = sha
    return line


def test_a_sample_s_last_bit_changes_its_identity() -> None:
    samples = [[([3, 4], [-0.5, -1.25])]]
    assert samples_sha(samples) == samples_sha([[([3, 4], [-0.5, -1.25])]])
    assert samples_sha(samples) != samples_sha([[([3, 4], [-0.5, -1.2500000000000002])]])
    assert samples_sha(samples) != samples_sha([[([3, 5], [-0.5, -1.25])]])


def test_only_runs_with_both_engines_are_compared() -> None:
    lines = [
        _line("eager", 8, "aa"),
        _line("compiled", 8, "aa"),
        _line("eager", 32, "bb"),
        _line("compiled", 32, "cc"),
        _line("eager", 64, "dd"),  # no compiled run of 64 rows
        _line("transformers", 8, None),
    ]
    assert compiled_alike(lines) == {"tiny/8/float32/6": True, "tiny/32/float32/6": False}
