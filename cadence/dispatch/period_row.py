"""The row a period is recorded with: the trainer's figures and what only the dispatcher knows.

```
 VersionReady(k, metrics of k-1) ─► PeriodMetrics.from_row ─► + workers registered, prompts reassigned
   over-sampled, the ledger still on k-1 ─► + prompts issued (refills included), groups stopped
   ─► metrics.jsonl (monitor/run_dir.py)
```

Invariant: the trainer's figures are recorded as they came; `workers` and `reassigned` are the
dispatcher's when the row arrives; `prompts_issued` and `groups_stopped` only of the ledger's own period.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cadence.dispatch.ledger import Ledger
from cadence.dispatch.roster import Peer
from cadence.monitor.period_metrics import PeriodMetrics


def period_row(
    metrics: Mapping[str, Any], peers: Mapping[bytes, Peer], reassigned: int, ledger: Ledger
) -> PeriodMetrics | None:
    """The row of the period a version's `metrics` close, completed with the rollout workers of
    `peers` and the prompts `reassigned` so far (and an over-sampled period's prompts issued and
    stopped, from `ledger`); None when the version carries none (the run's first)."""
    if not metrics:
        return None
    row = PeriodMetrics.from_row(metrics)
    workers = sum(1 for p in peers.values() if p.role == "rollout")
    row = replace(row, workers=workers, reassigned=reassigned)
    if row.groups_filtered is not None and ledger.period == row.period:  # an over-sampled run's
        issued = ledger.issued
        stopped = max(issued - row.groups - row.groups_filtered, 0)
        row = replace(row, prompts_issued=issued, groups_stopped=stopped)
    return row
