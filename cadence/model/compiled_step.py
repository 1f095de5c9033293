"""The decode step as the engine runs it: ``decode_step`` itself (eager, the reference) or compiled
once with ``torch.compile`` (Inductor's C++ on the CPU; CUDA graphs on a GPU), over the model's own
weight tensors, so a version loaded into them keeps every compiled graph valid. One layer is compiled
and stamped out for every layer (``decode_step.layer_step``, a nested compile region), and the
compiled step computes the eager step's bits (``exact_ops``; 16-bit values rounded where eager rounds
them).

Invariant: a compiled step that fails, at its compile or at any later call, is never retried: the
step falls back to eager for good, with one ``engine_compile_failed`` log line, and that step is
computed again eagerly (a failed call has written nothing the eager one does not write the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

import structlog
import torch
from torch import Tensor
from torch._dynamo import config as dynamo_config
from torch.fx.experimental import _config as fx_config

from cadence.model.decode_step import decode_step, weights_first_here
from cadence.model.transformer import Transformer

log = structlog.get_logger()

CompileMode = Literal["auto", "on", "off"]

Compiler = Callable[..., Callable[..., Tensor]]


def wants_compile(mode: CompileMode, device: torch.device) -> bool:
    """``on`` and ``off`` as said; ``auto``: on a GPU, where a step's launches are what it costs. On
    the CPU a step's matrix products dominate: compiled, SmolLM2's step was within a few percent of
    the eager one either way (a compile of 10-16 s a worker), so there it is asked for (``on``), not
    assumed."""
    if mode != "auto":
        return mode == "on"
    return device.type == "cuda"


class StepRunner:
    """Runs the decode step of ``model`` eager or compiled; ``compile_s`` is the time the compiled
    step's first calls took to compile (0 until one did), ``compiled`` whether it runs compiled now."""

    def __init__(
        self, model: Transformer, compiled: bool, compiler: Compiler | None = None, by_rows: bool = True
    ) -> None:
        self.model = model
        self.compiled = compiled
        self.by_rows = by_rows  # decode_step's attention of each row alike whatever the batch
        self.compile_s = 0.0
        self._shapes: set[tuple[int, int, int]] = set()
        self._fn: Callable[..., Tensor] = decode_step
        if compiled:
            self._fn = self._compile(compiler or torch.compile)

    def _compile(self, compiler: Compiler) -> Callable[..., Tensor]:
        """Compiled with symbolic rows and width (one compile serves every bucket); on a GPU each
        shape's launches recorded once as a CUDA graph and replayed."""
        # a 16-bit value rounded where the eager step rounds it, not kept in float32 through a fusion
        options: dict[str, bool] = {"emulate_precision_casts": True}
        if next(self.model.parameters()).device.type == "cuda":
            options["triton.cudagraphs"] = True  # what mode="reduce-overhead" asks, which takes no options
        return compiler(decode_step, fullgraph=True, dynamic=True, options=options)

    def __call__(
        self,
        keys: Sequence[Tensor],
        values: Sequence[Tensor],
        tokens: Tensor,
        positions: Tensor,
        write_at: Tensor,
        width: int,
        live: int | None = None,
    ) -> Tensor:
        """The logits of ``decode_step``; ``live``: the rows that attend where eager (a compiled step
        attends all its rows: one shape a bucket)."""
        first = weights_first_here(tokens.device)  # a plain bool into the compiled step: a guard
        if not self.compiled:
            return decode_step(
                self.model, keys, values, tokens, positions, write_at, width, first, self.by_rows, live
            )
        shape = (tokens.shape[0], width, keys[0].shape[2])
        fresh = shape not in self._shapes
        if fresh:
            for cache in (*keys, *values):  # allocated once an engine: its sizes are constants
                torch._dynamo.mark_static(cache)  # (on a GPU, TorchEngine.allocate fixed its address)
        begin = time.perf_counter()
        try:
            # no size taken as another's because they happen to be equal once (rows as kv heads);
            # a norm's epsilon a constant, as the layers' stamped-out region takes it
            with (
                fx_config.patch(use_duck_shape=False),  # type: ignore[attr-defined]
                dynamo_config.patch(specialize_float=True),
            ):
                logits = self._fn(
                    self.model, keys, values, tokens, positions, write_at, width, first, self.by_rows
                )
        except Exception as error:  # noqa: BLE001 - any compiler failure: eager from now on
            self.compiled = False
            log.warning("engine_compile_failed", error=repr(error)[:500], rows=shape[0], width=width)
            return decode_step(
                self.model, keys, values, tokens, positions, write_at, width, first, self.by_rows
            )
        if fresh:
            self._shapes.add(shape)
            took = time.perf_counter() - begin
            self.compile_s += took
            log.info(
                "engine_step_compiled", rows=shape[0], width=width, length=shape[2], seconds=round(took, 3)
            )
        return logits
