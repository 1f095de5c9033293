"""Timed stand-ins for the engine and the learner, so `cadence bench pipeline` measures the
pipeline itself (actors, sockets, periods) with generation and training of known cost.

Invariant: the simulated engine decodes a batch's groups together, as a batched engine does: a group
ends when its longest sample has had its tokens (`gen_s_per_token` each), lengths drawn log-normally
(a long tail) from each sample's own seed, and is handed back then (`ended`); a stopped group's time
is not waited for; the simulated learner's cost is proportional to the tokens it is given.
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
from cadence.training.train_group import sampled_tokens
from cadence.wire.buffer import Buffer
from cadence.wire.digest import checksum

_POLL_S = 0.005  # how often a simulated decode looks for a stop


class SimulatedEngine:
    def __init__(
        self, cfg: SimulatedConfig, eos_id: int, token_ids: list[int], max_new_tokens: int = 0
    ) -> None:
        self.cfg = cfg
        self.max_new_tokens = max_new_tokens  # an engine's token limit (0: `length_max` alone)
        self.eos_id = eos_id
        self.token_ids = token_ids
        self.version_bytes = 0

    def load(self, weights: bytes | Buffer) -> None:
        self.version_bytes = len(weights)

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.version_bytes = state_nbytes(state)

    def length(self, seed: int) -> int:
        rng = random.Random(seed)
        n = int(self.cfg.length_median * math.exp(self.cfg.length_sigma * rng.gauss(0.0, 1.0)))
        limit = min(self.cfg.length_max, self.max_new_tokens or self.cfg.length_max)
        return max(1, min(limit, n))

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        """Every group decoded together (whatever the temperature): group i ends once its longest
        sample would have, and goes to `ended` then; `stopped()` is polled meanwhile, and a group it
        names is dropped (its entry []); when every group left is stopped the call returns."""
        made = [self._completions(seeds) for _, seeds in groups]
        ends = [self.cfg.gen_s_per_token * max((len(c.tokens) for c in g), default=0) for g in made]
        start = time.monotonic()
        dropped: set[int] = set()
        for i in sorted(range(len(groups)), key=lambda i: (ends[i], i)):
            while i not in dropped and (left := start + ends[i] - time.monotonic()) > 0:
                time.sleep(min(left, _POLL_S) if stopped is not None else left)
                dropped |= set(stopped()) if stopped is not None else set()
            if i in dropped:
                made[i] = []
            elif ended is not None:
                ended(i, made[i])
        return made

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        return self.generate_many([(prompt, seeds)])[0]

    def _completions(self, seeds: list[int]) -> list[Completion]:
        out = []
        for seed in seeds:
            n = self.length(seed)
            rng = random.Random(seed + 1)
            tokens = [rng.choice(self.token_ids) for _ in range(n - 1)] + [self.eos_id]
            out.append(Completion(tokens=tokens, logprobs=[0.0] * n, finished=True))
        return out


class SimulatedLearner:
    def __init__(self, cfg: SimulatedConfig) -> None:
        self.cfg = cfg
        self.steps = 0
        self.loss_tokens = 0.0  # of the step under way: the stand-in trains every sampled token

    def train_groups(self, groups: Sequence[TrainGroup]) -> dict[str, float]:
        tokens = sum(len(g.prompt) + len(c) for g in groups for c in g.completions)
        time.sleep(self.cfg.train_s_per_token * tokens)
        self.loss_tokens += sum(sampled_tokens(groups))
        return {"tokens": float(tokens)}

    def step(self, normaliser: float, lr: float | None = None) -> dict[str, float]:
        time.sleep(self.cfg.step_s)
        self.steps += 1
        info, self.loss_tokens = {"loss_tokens": self.loss_tokens}, 0.0
        return info

    def weights(self, alloc: Callable[[int], Buffer] = bytearray, dtype: str | None = None) -> bytes | Buffer:
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
