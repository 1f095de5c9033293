"""Where a trainer process stands among the data-parallel ranks torchrun started
(`cadence/launch/torchrun.py`): its rank, the world, and its device index on this host.

Invariant: a trainer's place is the one torchrun announced, and its world is `trainer.ranks`, or the
trainer does not start. No torch here, so the launcher stays light.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from cadence.config import ConfigError, TrainerConfig


@dataclass(frozen=True)
class Ranks:
    """This process's place: `rank` of `world`, and its device index on this host (`local`)."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def name(self) -> str:
        """The actor's name in logs: `trainer` for rank 0, `trainer.rank<R>` for a follower."""
        return "trainer" if self.leader else f"trainer.rank{self.rank}"


def ranks_from_env(cfg: TrainerConfig, env: Mapping[str, str] = os.environ) -> Ranks:
    """The ranks torchrun announced (WORLD_SIZE, RANK, LOCAL_RANK), checked against `trainer.ranks`."""
    world = int(env.get("WORLD_SIZE", "1"))
    if world != cfg.ranks:
        if "WORLD_SIZE" not in env:
            raise ConfigError(
                f"trainer.ranks = {cfg.ranks} wants the trainer started by torchrun with that many"
                f" processes (python -m torch.distributed.run --nproc-per-node {cfg.ranks} -m cadence"
                " trainer …); `cadence run` does so itself"
            )
        raise ConfigError(
            f"trainer.ranks = {cfg.ranks}, but torchrun started {world} processes (WORLD_SIZE);"
            f" set trainer.ranks = {world}"
        )
    return Ranks(int(env.get("RANK", "0")), world, int(env.get("LOCAL_RANK", "0")))
