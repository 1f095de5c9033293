"""What every vLLM test module shares: its marks (skipped, with the reason, where vLLM does not
import), and its one engine."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cadence.config import ConfigError, RunConfig
from cadence.launch.build import make_engine, make_tokenizer
from cadence.model.vllm_engine import VllmEngine, import_vllm

try:
    import_vllm()
    VLLM_MISSING = ""
except ConfigError as exc:
    VLLM_MISSING = str(exc)

VLLM_MARKS = [
    pytest.mark.vllm,
    pytest.mark.skipif(bool(VLLM_MISSING), reason=f"vLLM tests run in .venv-vllm: {VLLM_MISSING}"),
]


def module_engine(cfg: RunConfig) -> Iterator[VllmEngine]:
    """The body of a module-scoped engine fixture: one vLLM engine a module, deleted at its end
    (deleting one while another lives in the process tears down the parallel groups it uses), with
    what still held it in a reference cycle (an actor's cancelled tasks) collected now, not once the
    next module's engine lives."""
    built = make_engine(cfg, make_tokenizer(cfg))
    assert isinstance(built, VllmEngine)
    yield built
    del built
    gc.collect()
