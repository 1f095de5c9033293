"""What the dispatcher says of each rollout worker, read from its log (`DIR/logs/dispatcher.jsonl`):
joined, lost, or not seen. `cadence slurm status` shows it beside Slurm's state of each job, since
the dispatcher declares a silent worker lost after its liveness (seconds) and Slurm a dead node only
after its node timeout (minutes).

Invariant: only the events of the dispatcher that runs now (after its last `dispatcher_started`)
count; a line that is no JSON object (one being written) is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVENTS = ("dispatcher_started", "peer_joined", "worker_lost")


def dispatcher_view(out: Path) -> dict[str, dict[str, Any]]:
    """Worker name ─► {"state": "joined" | "lost", "at": the event's time, "reason": why it was lost}."""
    path = out / "logs" / "dispatcher.jsonl"
    if not path.exists():
        return {}
    view: dict[str, dict[str, Any]] = {}
    with path.open("rb") as f:
        for line in f:
            if not any(e.encode() in line for e in EVENTS):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            name = str(event.get("peer", ""))
            if event.get("event") == "dispatcher_started":
                view.clear()
            elif event.get("event") == "peer_joined" and event.get("role") == "rollout":
                view[name] = {"state": "joined", "at": event.get("ts", "")}
            elif event.get("event") == "worker_lost":  # re-registered: a peer_joined follows
                view[name] = {"state": "lost", "at": event.get("ts", ""), "reason": event.get("reason", "")}
    return view
