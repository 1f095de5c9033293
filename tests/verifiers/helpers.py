"""What every verifiers test module shares: its marks (skipped, with the reason, where verifiers does
not import), the folder of the test's own verifiers environment package (`vf_calculator`, imported by
verifiers by its id as an installed one would be), and the agent that plays it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import verifiers.v1  # noqa: F401

    VF_MISSING = ""
except ImportError as exc:
    VF_MISSING = str(exc)

VF_MARKS = [
    pytest.mark.verifiers,
    pytest.mark.skipif(bool(VF_MISSING), reason=f"verifiers tests run in .venv-verifiers: {VF_MISSING}"),
]
PACKAGES = Path(__file__).parent / "packages"


def installed() -> None:
    """`vf_calculator` importable by its id, as if installed."""
    if str(PACKAGES) not in sys.path:
        sys.path.insert(0, str(PACKAGES))
