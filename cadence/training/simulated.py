"""Timed stand-ins for the engine and the learner, so `cadence bench pipeline` measures the
pipeline itself (actors, sockets, periods) with generation and training of known cost.

Invariant: the simulated engine's cost of a group is that of its longest sample (a batch ends
with its last sequence), lengths drawn log-normally (a long tail) from each sample's own seed;
the simulated learner's cost is proportional to the tokens it is given.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from cadence.config import SimulatedConfig
from cadence.model.checkpoint import state_nbytes
from cadence.model.engine import Completion, GroupEnded, StoppedGroups
from cadence.training.learner import TrainGroup
from cadence.wire.digest import checksum


class SimulatedEngine:
    def __init__(self, cfg: SimulatedConfig, eos_id: int, token_ids: list[int]) -> None:
        self.cfg = cfg
        self.eos_id = eos_id
        self.token_ids = token_ids
        self.version_bytes = 0

    def load(self, weights: bytes | bytearray) -> None:
        self.version_bytes = len(weights)

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.version_bytes = state_nbytes(state)

    def length(self, seed: int) -> int:
        rng = random.Random(seed)
        n = int(self.cfg.length_median * math.exp(self.cfg.length_sigma * rng.gauss(0.0, 1.0)))
        return max(1, min(self.cfg.length_max, n))

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        """One group after another: the simulated costs are those of one group at a time (whatever the
        temperature); `ended` is told each group once made, `stopped` asked between two groups (a
        stopped group is not made: [])."""
        out: list[list[Completion]] = []
        for i, (prompt, seeds) in enumerate(groups):
            if i > 0 and stopped is not None and i in stopped():
                out.append([])
                continue
            out.append(self.generate(prompt, seeds))
            if ended is not None:
                ended(i, out[-1])
        return out

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        lengths = [self.length(s) for s in seeds]
        time.sleep(self.cfg.gen_s_per_token * max(lengths, default=0))
        out = []
        for seed, n in zip(seeds, lengths, strict=True):
            rng = random.Random(seed + 1)
            tokens = [rng.choice(self.token_ids) for _ in range(n - 1)] + [self.eos_id]
            out.append(Completion(tokens=tokens, logprobs=[0.0] * n, finished=True))
        return out


class SimulatedLearner:
    def __init__(self, cfg: SimulatedConfig) -> None:
        self.cfg = cfg
        self.steps = 0

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        tokens = sum(len(g.prompt) + len(c) for g in groups for c in g.completions)
        time.sleep(self.cfg.train_s_per_token * tokens)
        return {"tokens": float(tokens)}

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        time.sleep(self.cfg.step_s)
        self.steps += 1
        return {}

    def weights(
        self, alloc: Callable[[int], bytearray] = bytearray, dtype: str | None = None
    ) -> bytes | bytearray:
        """Stand-in bytes of the version (no floating-point weights: `dtype` changes nothing)."""
        seed = hashlib.sha256(f"simulated/{self.steps}".encode()).digest()
        return (seed * (self.cfg.weights_bytes // len(seed) + 1))[: self.cfg.weights_bytes]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"weights": torch.frombuffer(bytearray(self.weights()), dtype=torch.uint8)}

    def save(self, directory: Path) -> str:
        data = self.weights()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "weights.bin").write_bytes(data)
        (directory / "config.json").write_text(json.dumps({"simulated": True, "steps": self.steps}))
        return checksum(data)

    def save_state(self, directory: Path) -> None:
        (directory / "simulated.json").write_text(json.dumps({"steps": self.steps}))

    def load_state(self, directory: Path) -> None:
        self.steps = int(json.loads((directory / "simulated.json").read_text())["steps"])
