"""What every vLLM test module shares: its marks (skipped, with the reason, where vLLM does not import)."""

from __future__ import annotations

import pytest

from cadence.config import ConfigError
from cadence.model.vllm_engine import import_vllm

try:
    import_vllm()
    VLLM_MISSING = ""
except ConfigError as exc:
    VLLM_MISSING = str(exc)

VLLM_MARKS = [
    pytest.mark.vllm,
    pytest.mark.skipif(bool(VLLM_MISSING), reason=f"vLLM tests run in .venv-vllm: {VLLM_MISSING}"),
]
