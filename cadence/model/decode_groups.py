"""The groups of a batched decode's rows: which group each row belongs to, and when a group ends or
is stopped.

The rows lie group after group (``sizes``: the samples of each (prompt, seeds) group, in the caller's
order; a group of no samples has no rows). A row ends on eos (or at the decode's last step); a group
ends once every row of it has ended; the caller may stop a group before it ends.

Invariant: every group is closed exactly once, as ended (``take_ended``, ``take_rest``; a group of no
rows is closed from the start, having ended before any step) or as stopped (``stop``); a closed group
is never taken again, and only a stopped group's rows are ``stopped_rows``. The per-step count runs on
the rows' device; Python sees a group only when it closes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate

import torch
from torch import Tensor


class DecodeGroups:
    def __init__(self, sizes: Sequence[int], device: torch.device) -> None:
        self._size = torch.tensor(list(sizes), dtype=torch.long, device=device)
        self._of_row = torch.repeat_interleave(torch.arange(len(sizes), device=device), self._size)
        self._ended_rows = torch.zeros_like(self._size)  # a group's rows that have ended on eos
        self._closed = self._size == 0
        self._stopped = torch.zeros_like(self._closed)
        self._open = {g for g, n in enumerate(sizes) if n}  # the groups not closed, as Python sees them
        self.stopped: set[int] = set()
        starts = list(accumulate(sizes, initial=0))
        self._rows = [slice(a, b) for a, b in zip(starts, starts[1:], strict=False)]

    def rows(self, group: int) -> slice:
        """The rows of ``group``, in the decode's order."""
        return self._rows[group]

    def take_ended(self, live: Tensor, ended: Tensor) -> list[int]:
        """Count the rows ``live`` [m] that ended at this step (``ended`` [m], each row marked only at
        the step it ended); the open groups whose every row has now ended, in index order, closed."""
        self._ended_rows.index_add_(0, self._of_row[live], ended.long())
        fresh = (self._ended_rows == self._size) & ~self._closed
        if not bool(fresh.any()):
            return []
        self._closed |= fresh
        taken: list[int] = fresh.nonzero().squeeze(1).tolist()
        self._open.difference_update(taken)
        return taken

    def take_rest(self) -> list[int]:
        """Every open group, in index order, closed as ended (the decode's last step ended them)."""
        rest = sorted(self._open)
        self._open.clear()
        self._closed.fill_(True)
        return rest

    def stop(self, groups: Iterable[int]) -> bool:
        """Close the open groups among ``groups`` as stopped (the others are ignored); whether any was."""
        fresh = [g for g in groups if g in self._open]
        if not fresh:
            return False
        self._open.difference_update(fresh)
        self.stopped.update(fresh)
        index = torch.tensor(fresh, dtype=torch.long, device=self._size.device)
        self._closed[index] = True
        self._stopped[index] = True
        return True

    def stopped_rows(self, live: Tensor) -> Tensor:
        """Which of the rows ``live`` [m] belong to a stopped group: a bool mask [m]."""
        return self._stopped[self._of_row[live]]
