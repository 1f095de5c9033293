"""How every bench ends: its figures as one JSON line, or one aligned line a figure."""

from __future__ import annotations

import json
from typing import Any


def report(result: dict[str, Any], as_json: bool) -> int:
    """Print `result` (the last line is the JSON with `as_json`); the exit status, 0."""
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 0
