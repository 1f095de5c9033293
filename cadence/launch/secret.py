"""The run's secret: written into the run folder (mode 0600) by the launcher or the dispatcher,
whichever comes first, and shown by the trainer and the publisher when they register, so that their
roles go to the run's own processes, not to whoever registers first.

Invariant: a run folder holds at most one secret, made once and kept (a resumed run shows the same);
a dispatcher always has one (it makes it before it writes `dispatcher.addr`) and refuses a trainer or
publisher that does not show it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_FILE = "run.secret"


def make_run_secret(out: Path) -> str:
    """The run folder's secret, made now (readable by its owner only) unless it has one."""
    path = out / SECRET_FILE
    if path.exists():
        return read_run_secret(out)
    out.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def read_run_secret(out: Path) -> str:
    """The run folder's secret; "" when it has none."""
    try:
        return (out / SECRET_FILE).read_text().strip()
    except FileNotFoundError:
        return ""
