"""vLLM taking adapter versions: each version a `LoRARequest` every request of it is generated with.

```
 VllmLoraEngine(folder of the base, …, spec, base)   vLLM built with enable_lora, max_lora_rank = r
   load(bytes)         adapters, scale, base identity (lora_files.py; refused for another base)
   load_state(tensors) adapters received by broadcast
   ─► the version's PEFT folder written under a private temporary folder (the previous one removed)
   ─► lora_request = LoRARequest("cadence-v<n>", n, folder): vLLM loads it at the next request
```

Invariant: after a load, every request is generated with that version's adapters on the unchanged
base; a version's adapters get an id of their own, so vLLM never serves a cached older one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from itertools import count
from pathlib import Path

from torch import Tensor

from cadence.config import VllmConfig
from cadence.model.engine import SamplingParams
from cadence.model.lora import LoraSpec
from cadence.model.lora_files import read_adapter_bytes, write_peft
from cadence.model.vllm_engine import VllmEngine
from cadence.wire.buffer import Buffer


class VllmLoraEngine(VllmEngine):
    """vLLM on the base `model` folder, generating with the adapters of the version last loaded."""

    def __init__(
        self,
        model: Path,
        eos_id: int,
        params: SamplingParams,
        cfg: VllmConfig,
        seed: int,
        spec: LoraSpec,
        base: str,
    ) -> None:
        options = {"enable_lora": True, "max_lora_rank": spec.rank, "max_loras": 1}
        super().__init__(model, eos_id, params, cfg, seed, options)
        from vllm.lora.request import LoRARequest

        self._lora_request = LoRARequest
        self.spec = spec
        self.base = base
        self._folder = Path(tempfile.mkdtemp(prefix="cadence-lora-"))
        self._ids = count(1)  # vLLM's adapter ids start at 1

    def load(self, weights: bytes | Buffer) -> None:
        adapters, scale, base = read_adapter_bytes(weights)
        if base != self.base:
            raise ValueError(
                f"a version of adapters trained on base {base}, while vLLM serves base {self.base}:"
                " the trainer and the workers must load the same model.checkpoint"
            )
        if abs(scale - self.spec.scale) > 1e-12 * self.spec.scale:
            raise ValueError(f"a version of adapters at scale {scale}, vLLM was built for {self.spec.scale}")
        self.load_state(adapters)

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        n = next(self._ids)
        folder = self._folder / f"v{n}"
        write_peft(folder, {k: t.float() for k, t in state.items()}, self.spec, self.base, None)
        previous = self._folder / f"v{n - 1}"
        self.lora_request = self._lora_request(f"cadence-v{n}", n, str(folder))
        shutil.rmtree(previous, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def __del__(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
