"""The peak memory of each process of a run, read from outside while it runs.

```
 /proc/<pid>/cmdline: "-m cadence <role> ... --out <folder>"  ─► which process is which actor
 /proc/<pid>/status VmHWM (the kernel's own high-water mark)   ─► peak resident memory, MiB
 nvidia-smi --query-compute-apps=pid,used_memory (if present) ─► peak device memory, MiB
```

Invariant: a process counts only if its command line names the run folder it was started for, so a
second run on the machine is never measured. VmHWM is the kernel's maximum, so the last reading
before a process ends is its true peak of resident memory; device memory is sampled every `every_s`
(the driver keeps no maximum), so its peak is a lower bound, and it includes the CUDA context.
"""

from __future__ import annotations

import threading
from pathlib import Path

from cadence.bench.where import nvidia_smi

ROLES = ("dispatcher", "trainer", "rollout")


def role_of(argv: list[str], folder: str) -> str | None:
    """The actor a command line starts, with its worker name (`rollout-0`); None: not this run's."""
    if "cadence" not in argv or folder not in argv:
        return None
    after = argv[argv.index("cadence") + 1 :]
    if not after or after[0] not in ROLES:
        return None
    if after[0] == "rollout" and "--name" in after:
        return after[after.index("--name") + 1]
    return after[0]


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def device_mib() -> dict[int, float]:
    """pid -> device memory in use (MiB), from nvidia-smi; empty without one."""
    used: dict[int, float] = {}
    for row in nvidia_smi("query-compute-apps=pid,used_memory"):
        if len(row) == 2 and row[0].isdigit():
            try:
                used[int(row[0])] = float(row[1])
            except ValueError:
                continue
    return used


class PeakMemory:
    """Samples the run's processes on a thread until stopped; `peaks()` gives, per actor, the peak
    resident memory (`rss_mib`) and, where a GPU is seen, the peak device memory (`device_mib`)."""

    def __init__(self, folder: Path, every_s: float = 0.5) -> None:
        self._folder = str(folder)
        self._every_s = every_s
        self._rss: dict[str, float] = {}
        self._device: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        roles: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                role = role_of(_argv(int(entry.name)), self._folder)
                if role is not None:
                    roles[int(entry.name)] = role
        for pid, role in roles.items():
            hwm = _hwm_mib(pid)
            if hwm is not None:
                self._rss[role] = max(self._rss.get(role, 0.0), hwm)
        for pid, mib in device_mib().items():
            if pid in roles:
                self._device[roles[pid]] = max(self._device.get(roles[pid], 0.0), mib)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.sample()

    def peaks(self) -> dict[str, dict[str, float]]:
        return {
            role: {"rss_mib": round(rss, 1)}
            | ({"device_mib": round(self._device[role], 1)} if role in self._device else {})
            for role, rss in sorted(self._rss.items())
        }
