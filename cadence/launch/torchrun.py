"""How `cadence run` starts the trainer's data-parallel ranks: torchrun's command line, a free port for
its rendezvous, and a child that dies with the process that started it.

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

import signal
import socket
import sys


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
