"""A group's rows and its samples: a `GroupResult`'s token lists (`completions`, `logprobs`, `masks`,
`truncated`) are one a row, its scores and figures one a sample (an episode). A row is its own sample
unless `episode_of` says otherwise: an agent's episode whose calls formed several token sequences is
one sample of several rows.

Invariant: pure functions of the lists they are given; with an empty `episode_of` every function is the
identity on rows (row i is sample i), so a group of one row a sample reads exactly as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise


def row_samples(episode_of: Sequence[int], rows: int) -> list[int]:
    """Each row's sample: `episode_of` as given, or row i → sample i when it is empty."""
    return list(episode_of) if episode_of else list(range(rows))


def per_sample(values: Sequence[int], episode_of: Sequence[int], samples: int) -> list[int]:
    """A per-row count summed over each sample's rows (`samples` of them)."""
    if not episode_of:
        return list(values)
    totals = [0] * samples
    for sample, value in zip(episode_of, values, strict=True):
        totals[sample] += value
    return totals


def rows_problem(episode_of: Sequence[int], rows: int, samples: int, most: int) -> str | None:
    """Why `episode_of` cannot map `rows` rows onto `samples` samples, at most `most` rows a sample
    (0: no bound), or None: empty and as many rows as samples, or one entry a row, in order from 0,
    each sample with at least one row."""
    if not episode_of:
        return None if rows == samples else f"{rows} rows but {samples} samples, and no episode_of"
    if len(episode_of) != rows:
        return f"{rows} rows but an episode_of of {len(episode_of)}"
    if episode_of[0] != 0 or any(b - a not in (0, 1) for a, b in pairwise(episode_of)):
        return "episode_of not in order from sample 0, one step at a time (a sample without a row)"
    if episode_of[-1] != samples - 1:
        return f"episode_of names {episode_of[-1] + 1} samples, the group has {samples}"
    if most:
        widest = max(Counter(episode_of).values())
        if widest > most:
            return f"a sample of {widest} rows, beyond the run's {most} a sample"
    return None
