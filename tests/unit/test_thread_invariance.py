"""The thread probe: True only when every product and a whole call of the engine agree bit for bit
at both counts; a product or a call that moves with the thread count makes it False; a GPU or a
batch-variant engine is never said alike; the calling thread's count is left as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import cadence.model.thread_invariance as probe
from cadence.launch.build import make_model, make_tokenizer
from cadence.model.engine import TorchEngine
from tests.conftest import tiny_config


@pytest.fixture
def engine() -> TorchEngine:
    cfg = tiny_config()
    model, _ = make_model(cfg, make_tokenizer(cfg))
    return TorchEngine(model, eos_id=-1, rows=8)


def test_equal_counts_are_alike_and_the_threads_are_left_as_they_were(engine: TorchEngine) -> None:
    assert probe.alike_at_threads(engine, 2, 2)
    before = torch.get_num_threads()
    probe.alike_at_threads(engine, 1, 2)
    assert torch.get_num_threads() == before


def test_a_product_that_moves_with_the_threads_is_not_alike(
    engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = probe.rows_product

    def moving(w: torch.Tensor, x: torch.Tensor, first: bool) -> Callable[[int], torch.Tensor]:
        def rows(m: int) -> torch.Tensor:
            out = real(w, x, first)(m)
            return out if torch.get_num_threads() == 1 else torch.nextafter(out, out + 1)

        return rows

    monkeypatch.setattr(probe, "rows_product", moving)
    assert not probe.alike_at_threads(engine, 1, 2)


def test_a_call_that_moves_with_the_threads_is_not_alike(
    engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "_products_alike", lambda *_: True)
    real = engine.generate_many

    def moving(*args: object, **kwargs: object) -> object:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        if torch.get_num_threads() != 1:
            out[0][0].logprobs[0] = torch.nextafter(
                torch.tensor(out[0][0].logprobs[0]), torch.tensor(0.0)
            ).item()
        return out

    monkeypatch.setattr(engine, "generate_many", moving)
    assert not probe.alike_at_threads(engine, 1, 2)
    monkeypatch.setattr(engine, "generate_many", real)
    assert probe.alike_at_threads(engine, 1, 2) == probe._calls_alike(engine, 1, 2)


def test_the_calls_probed_leave_no_trunk_behind(engine: TorchEngine) -> None:
    forgotten: list[int] = []
    engine.prefill.forget = lambda: forgotten.append(torch.get_num_threads())  # type: ignore[method-assign]
    probe._calls_alike(engine, 1, 2)
    assert forgotten == [1, 2, 2]  # before each call, at its count, and once more after the last


def test_a_batch_variant_engine_is_never_said_alike() -> None:
    cfg = tiny_config()
    model, _ = make_model(cfg, make_tokenizer(cfg))
    assert not probe.alike_at_threads(TorchEngine(model, eos_id=-1, rows=8, invariant=False), 1, 2)
