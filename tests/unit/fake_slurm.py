"""Slurm's client commands as a test answers them: the one fake, at the edge, recording each call.

`queue` is what squeue lists (id ─► state); `ended` what scontrol still knows of a job squeue no
longer lists; `refuse` maps a word in an sbatch call (a partition, a time) to Slurm's refusal."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from cadence.launch.slurm.allocation import SlurmError


class FakeSlurm:
    def __init__(self, nodes: int = 3) -> None:
        self.calls: list[list[str]] = []
        self.nodes = nodes
        self.next = 100
        self.queue: dict[str, str] = {}
        self.ended: dict[str, str] = {}
        self.refuse: dict[str, str] = {}

    def submitted(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "sbatch" and "--test-only" not in c]

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args))
        out = ""
        if args[0] == "sinfo":
            out = f"main* {self.nodes}\nspot 2\n"
        elif args[0] == "sbatch":
            text = " ".join(args) + "".join(_script(a) for a in args[1:])
            for word, said in self.refuse.items():
                if word in text:
                    raise SlurmError(f"sbatch --parsable failed: sbatch: error: {said}")
            if "--test-only" not in args:
                self.next += 1
                self.queue[str(self.next)] = "PENDING"
                out = f"{self.next}\n"
        elif args[0] == "squeue":
            ids = args[args.index("--jobs") + 1].split(",")
            out = "".join(f"{i}|{self.queue[i]}|n1\n" for i in ids if i in self.queue)
            if ids and not out and not any(i in self.ended for i in ids):
                raise SlurmError("squeue --noheader failed: slurm_load_jobs error: Invalid job id specified")
        elif args[0] == "scontrol" and args[1:3] == ["show", "job"]:
            job = args[-1]
            if job not in self.ended:
                raise SlurmError("scontrol show failed: slurm_load_jobs error: Invalid job id specified")
            out = f"JobId={job} JobName=x JobState={self.ended[job]} Reason=None\n"
        elif args[0] == "scancel":
            for i in args[1:]:
                if self.queue.pop(i, None) is not None:
                    self.ended[i] = "CANCELLED"
        return subprocess.CompletedProcess(list(args), 0, out, "")

    def finish(self, job: str, state: str) -> None:
        """`job` ends in `state`: squeue no longer lists it, scontrol still knows it."""
        self.queue.pop(job, None)
        self.ended[job] = state


def _script(arg: str) -> str:
    """The text of an sbatch script named in a call (the fake reads it as sbatch would)."""
    try:
        with open(arg) as f:
            return f.read() if arg.endswith(".sbatch") else ""
    except OSError:
        return ""
