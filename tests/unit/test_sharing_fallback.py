"""Where a host cannot share versions through memory, the publisher and the workers each say so in one
line and go on with the pull."""

from __future__ import annotations

import os

import pytest
import structlog

from cadence.actors import rollout_weights
from cadence.actors.rollout_weights import shared_reader
from cadence.launch.sharing import shared_versions
from cadence.transport import shared_memory
from tests.conftest import tiny_config


def test_no_memfd_is_a_reason_not_to_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "memfd_create", raising=False)
    assert shared_memory.sharing_problem() == "no memfd_create on this platform"


def test_a_sandbox_refusing_proc_is_a_reason_not_to_share(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(path: str, flags: int, mode: int = 0o777) -> int:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "open", refused)
    problem = shared_memory.sharing_problem()
    assert problem is not None and problem.startswith("PermissionError")


def test_a_host_that_cannot_share_is_said_once_by_each_side(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (shared_memory, rollout_weights):  # the publisher's and the worker's check
        monkeypatch.setattr(module, "sharing_problem", lambda: "no memfd_create on this platform")
    with structlog.testing.capture_logs() as logs:
        assert shared_versions(tiny_config()) is None
        assert shared_reader(True) is None
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("shared_memory_unavailable", "no memfd_create on this platform"),
        ("shared_memory_fallback", "no memfd_create on this platform"),
    ]


def test_sharing_turned_off_is_no_sharing_and_nothing_said() -> None:
    with structlog.testing.capture_logs() as logs:
        assert shared_versions(tiny_config("weights.share_on_host=false")) is None
        assert shared_reader(False) is None
    assert logs == []
