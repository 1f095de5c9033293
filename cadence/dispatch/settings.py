"""What the dispatcher reads of the run's configuration (built by `cadence.launch.settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DispatcherSettings:
    """What the dispatcher reads of the run's configuration (built by `launch/settings.py`).

    `on_trainer_loss`: "fail" ends the run when the trainer or its publisher is lost; "wait" holds
    the workers until a trainer resumed from its checkpoint registers again. `wait_for_workers_s`:
    how long prompts may wait with no rollout worker left before the run fails. `eval_every`: the
    versions evaluated on the eval set (0: none); `eval_samples`: samples an eval prompt;
    `keep_versions`: the versions the publisher keeps (an eval round lasts that long); `oversample`
    and `stream`: an over-sampled period's prompts at its start beyond B, and in all (`[sampling]`)."""

    periods: int
    prompts_per_period: int
    group_size: int
    on_trainer_loss: Literal["fail", "wait"]
    wait_for_workers_s: float = 300.0
    eval_every: int = 0
    eval_samples: int = 1
    keep_versions: int = 2  # the publisher's: an eval round lasts until that many versions later
    oversample: int = 0  # prompts queued beyond B at a period's start (`sampling.oversample`)
    stream: int = 0  # the prompts a period may issue, refills included (0: B; `sampling.ceiling`)
    max_credits: int = 0  # the credits a worker may hold (`rollout.inflight`; 0: no cap)
    hold_s: float = 0.0  # how long a worker may hold an assignment (0: derived from the run)
    hold_floor_s: float = 60.0  # the derived hold's least (20 liveness timeouts)
    hold_idle_floor_s: float = 0.0  # its least while another worker waits idle (a liveness timeout)
    run_secret: str = ""  # what a trainer or publisher must show to register (`run.secret`; "": none)
