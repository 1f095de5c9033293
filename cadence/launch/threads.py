"""Thread budgets: how many torch threads each actor of a run computes with.

```
 cores C of this host, W rollout workers, R trainer ranks (all started here by `cadence run`)
 worker:        rollout.threads, or max(1, C // (W + R))      an even share, the same in both modes
   alone        max(1, C // W) while the trainer waits        sync: all the while they generate;
                (if its engine computes the same bits with    periodic: while the trainer's activity
                both counts, measured at its first            on this host says it computes nothing,
                computation; else the share)                  read between two decode steps
 trainer rank:  trainer.threads, or
   sync         max(1, C // R)                                workers idle while it trains
   periodic     max(1, (C - W × worker's) // R)               what the workers leave: never more
                                                              threads than cores while both compute;
                max(1, C // R) once the period's last group   the workers idle until the next version
                is in (its last micro-batches, the step, the
                publish)
```

A thread more than the cores costs more than it brings: torch's OpenMP ops wait at every barrier for
a thread the scheduler has set aside. One SmolLM2 group's forward and backward on two cores beside one
other busy process: 1.9 s on one thread; on two, 18 s with OpenMP's default spinning wait, 2.3 s with
`OMP_WAIT_POLICY=PASSIVE`, which the launcher sets for every actor (`openmp_waits`). A thread that
sleeps at once, though, is woken for each of an op's parallel regions: a trainer computing alone on
its two threads, and a decode step's many small ops, lose 15-35 % to the wake-ups. So a waiting
thread first spins briefly (`GOMP_SPINCOUNT`, `SPIN_COUNT` turns: a few microseconds), then sleeps:
as fast as spinning when the cores are free, within 15 % of sleeping at once when one is not.

Invariant: a budget is at least one thread and depends only on the config and the host's core count,
so every process of a run on one host computes the same figures. A worker computes with the even
share in both modes, or with its sync budget where its engine was measured to compute the same bits
with both: either way both modes generate with the same arithmetic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from cadence.config import RunConfig


def host_cores() -> int:
    """Cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def rollout_threads(cfg: RunConfig, cores: int | None = None) -> int:
    if cfg.rollout.threads > 0:
        return cfg.rollout.threads
    cores = host_cores() if cores is None else cores
    return max(1, cores // (cfg.rollout.workers + cfg.trainer.ranks))


def rollout_threads_alone(cfg: RunConfig, cores: int | None = None) -> int:
    """A worker's threads while no trainer rank computes: the host's cores shared by the workers
    alone. In sync mode the trainer waits while they generate; in periodic mode a worker on the
    trainer's host takes them while the trainer's activity says it waits (`transport/activity.py`),
    its share otherwise. Taken only where the engine computes alike with both counts
    (`model/thread_invariance.py`): SmolLM2's generation on two threads is 1.4-1.7x that on one."""
    if cfg.rollout.threads > 0:
        return cfg.rollout.threads
    cores = host_cores() if cores is None else cores
    return max(1, cores // cfg.rollout.workers)


def trainer_threads(cfg: RunConfig, cores: int | None = None) -> int:
    if cfg.trainer.threads > 0:
        return cfg.trainer.threads
    cores = host_cores() if cores is None else cores
    if cfg.mode == "sync":
        return max(1, cores // cfg.trainer.ranks)
    left = cores - cfg.rollout.workers * rollout_threads(cfg, cores)
    return max(1, left // cfg.trainer.ranks)


def trainer_threads_alone(cfg: RunConfig, cores: int | None = None) -> int:
    """A trainer rank's threads once the period's last group is in: the workers have nothing to
    generate until the next version, so in both modes it takes what sync mode takes."""
    if cfg.trainer.threads > 0:
        return cfg.trainer.threads
    cores = host_cores() if cores is None else cores
    return max(1, cores // cfg.trainer.ranks)


SPIN_COUNT = 10_000
"""Turns a thread waiting at an OpenMP barrier spins before it sleeps (GNU OpenMP's `GOMP_SPINCOUNT`;
its default under `OMP_WAIT_POLICY=PASSIVE` is 0, else 300 000). Measured on 2 cores of an Intel
Xeon: a forward and backward on two threads alone 1.33 s sleeping at once, 1.12 s with 10 000 or
100 000 turns; beside one busy process 2.40 s, 2.76 s and 4.86 s."""


def openmp_waits(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP wait settings every actor's process gets: passive waits after a short spin, unless
    the user's environment sets either itself."""
    return {
        "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "GOMP_SPINCOUNT": environ.get("GOMP_SPINCOUNT", str(SPIN_COUNT)),
    }


def wait_as_launched(environ: MutableMapping[str, str], modules: Mapping[str, object]) -> bool:
    """An actor's process started otherwise than by `cadence run` (by hand, by a Slurm task) gets the
    launcher's waits (`openmp_waits`) where the user's environment does not set them: written into
    `environ` before OpenMP is loaded (it reads them once, when torch's libraries load); False when
    `modules` (sys.modules) holds torch already and nothing was written."""
    if "torch" in modules:
        return False
    environ.update(openmp_waits(environ))
    return True


def use_threads(threads: int) -> None:
    """Compute the calling thread's torch ops with `threads` threads (OpenMP's count is per thread:
    a worker thread that computes calls this itself)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
