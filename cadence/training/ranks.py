"""Where a trainer process stands among the data-parallel ranks, and how `cadence run` starts them.

```
 cadence run (trainer.ranks = N > 1)
   └─ python -m torch.distributed.run --nproc-per-node N --master-addr 127.0.0.1 --master-port P
        ├─ rank 0:      cadence trainer …   the trainer actor, its sockets, a DistributedLearner
        └─ rank 1..N-1: cadence trainer …   followers: no sockets, they execute rank 0's commands
```

Invariant: a rank never outlives the process that started it (torchrun's agent, or `cadence run`):
each asks the kernel for SIGKILL when its parent dies. No torch here, so the launcher stays light.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
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


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, even by SIGKILL (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def torchrun(ranks: int, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command that starts `ranks` processes of what follows it (`-m cadence trainer …`) on this host."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        host,
        "--master-port",
        str(port),
    ]
