"""The built-in generation engine: batched sampling of one or several prompts with a KV cache.

The log-prob recorded with each token is that of the distribution it was sampled from before top-p:
log softmax(logits / T), the learner's (ops/logprobs.py), at T = 1 when greedy.

Invariant: sample ``i`` of a ``generate`` call draws its randomness only from a generator seeded
with ``seeds[i]`` (one uniform per step, drawn up front), so it is the same sample whatever the
batch size and the other seeds; ``sample_seed`` makes that seed a pure function of
(run seed, period, prompt id, sample index), so a prompt regenerated elsewhere gives the same group.
Prompts are prefilled by ``prefill.py`` (the chat template's beginning, the ``trunk``, and a beginning
the caller names read rather than computed again; a prompt's prefill what it computes alone).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog
import torch
from torch import Tensor

from cadence.model.compiled_step import Compiler, StepRunner
from cadence.model.decode_loop import DecodeLoop, LoopStats
from cadence.model.decode_step import weights_first_here
from cadence.model.hf_state import load_hf_state_dict, share_hf_state_dict
from cadence.model.invariance import least_rows, product_shapes
from cadence.model.lora import LoraLinear
from cadence.model.prefill import Prefill
from cadence.model.slots import LENGTH_STEP, WIDTH_STEP, SlotCache, cache_bytes, cache_dtype, step_rows
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import Transformer, mark_rows
from cadence.ops.packing import shared_trunk

log = structlog.get_logger()


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``temperature`` 0 is greedy; ``top_p`` keeps the smallest nucleus reaching it."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")

    def overridden(
        self, temperature: float | None = None, max_new_tokens: int | None = None
    ) -> SamplingParams:
        """These params with one call's own `temperature` and `max_new_tokens` where given (None: this
        one's)."""
        params = self if temperature is None else replace(self, temperature=temperature)
        if max_new_tokens is not None:
            params = replace(params, max_new_tokens=max_new_tokens)
        return params


@dataclass(frozen=True)
class Completion:
    """One sample: its tokens (with the final eos if it stopped there) and their model log-probs."""

    tokens: list[int]
    logprobs: list[float]  # log_softmax(logits / T) (T = 1 when greedy; top-p not renormalised), one a token
    finished: bool  # True when it ended on eos, False when it reached max_new_tokens


# Told, on the generating thread, a group's index and its completions as soon as every sample of it
# has ended: exactly what the call returns for it.
GroupEnded = Callable[[int, list[Completion]], None]
# Asked between two decode steps for the indices of the groups to stop now.
StoppedGroups = Callable[[], Collection[int]]
# Asked between two decode steps, with the most prompt tokens a group of the call's token limit may
# have to join the call, for (prompt, seeds) groups to join it, or (prompt, seeds, limit) of a limit
# of their own (at most the call's; the prompt may be longer by as much less): they take the indices
# after the call's groups, in order.
JoinedGroup = tuple[Sequence[int], Sequence[int]] | tuple[Sequence[int], Sequence[int], int]
JoiningGroups = Callable[[int], Sequence[JoinedGroup]]


def sample_seed(run_seed: int, period: int, prompt_id: int, index: int) -> int:
    """A stable 63-bit seed for one sample, independent of Python's hash randomisation."""
    key = f"{run_seed}:{period}:{prompt_id}:{index}".encode()
    digest = hashlib.blake2b(key, digest_size=8, person=b"cadence-sample").digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def prompt_trunk(tokenizer: TextTokenizer) -> list[int]:
    """The beginning every prompt's encoding shares: what the chat template puts before the user's
    text (its system prompt), found as the common beginning of two unlike prompts (two digits: every
    tokenizer here has them). A prompt that does not begin with it (a text that merges with the
    template's last tokens) is simply computed whole."""
    first = tokenizer.encode_prompt("0")
    return first[: shared_trunk([first, tokenizer.encode_prompt("1")])]


DEFAULT_ROWS = 64  # the cache's slots when none are asked for: the rows a decode step computes at most


class TorchEngine:
    """Generates with a ``Transformer`` in this process, its weights and activations in ``dtype``
    (a version of another dtype is rounded on load); the logits are sampled in float32.

    ``rows``: the slots of its KV cache, the most samples decoded at once (a call with more admits
    them as others end); ``compiled``: the decode step compiled (``compiled_step.py``) or eager;
    ``readback``: the decode steps between two reads of which rows have ended (1 on the CPU, where a
    read costs nothing; more on a GPU, where each read waits for the device); ``buckets``: each step
    computes a bucket of rows (2, 4, 8, then multiples of 16) rather than exactly the rows held (None:
    when compiled or off the CPU, where few shapes pay; eager on the CPU a padded row costs its share);
    ``invariant``: on the CPU every product computes at least the rows from which each row comes out
    as in any batch, and the decode attention row by row (``invariance.py``), so a sample depends only
    on its prompt, its seed and the weights (off: exactly the rows held, the last bits of a row's
    logits then depending on its neighbours)."""

    def __init__(
        self,
        model: Transformer,
        eos_id: int,
        device: str = "cpu",
        trunk: Sequence[int] = (),
        dtype: torch.dtype = torch.float32,
        rows: int = DEFAULT_ROWS,
        compiled: bool = False,
        readback: int | None = None,
        compiler: Compiler | None = None,
        buckets: bool | None = None,
        invariant: bool = True,
    ) -> None:
        if rows < 1:
            raise ValueError(f"the engine needs at least one row, got {rows}")
        self.model = model.to(device=device, dtype=dtype).eval()
        self.eos_id = eos_id
        self.device = torch.device(device)
        self.dtype = dtype
        self.rows = rows
        self.readback = readback if readback is not None else (1 if self.device.type == "cpu" else 8)
        self.prefill = Prefill(self.model, self.device, trunk, functools.partial(self._least_rows, False))
        self._cache: SlotCache | None = None
        self.runner = StepRunner(self.model, compiled, compiler, invariant)
        self.invariant = invariant
        # a step of a few fixed shapes where it pays (compiled, a GPU's); eager on the CPU: the rows held
        self.buckets = buckets if buckets is not None else (self.runner.compiled or self.device.type != "cpu")
        self.last_call = LoopStats()  # what the last generate_many computed
        self.pace: Callable[[], None] | None = None  # asked between decode steps (thread_invariance.py)

    def load_state_dict(self, state: Mapping[str, Tensor], share: bool = False) -> None:
        """Take HF-named weights (strict; a tied head may be absent), copied into the model's own
        tensors. With ``share``, when every tensor has the dtype and device of the weight it replaces,
        the tensors themselves become the weights instead (no copy of the whole model): the caller
        leaves them unchanged until the next load. A compiled engine always copies: its compiled step
        reads the weights where they were when it was compiled."""
        with torch.no_grad():
            own = dict(self.model.named_parameters(remove_duplicate=False)) if share else {}
            fits = (
                share
                and not self.runner.compiled
                and all(
                    key in own and t.dtype == own[key].dtype and t.device == own[key].device
                    for key, t in state.items()
                )
            )
            if fits:
                share_hf_state_dict(self.model, state)
            else:
                load_hf_state_dict(self.model, state)
        self.weights_changed()

    @property
    def trunk(self) -> list[int]:
        """The beginning every prompt shares, read from its keys and values (``Prefill``)."""
        return self.prefill.trunk

    @trunk.setter
    def trunk(self, trunk: list[int]) -> None:
        self.prefill.trunk = list(trunk)
        self.prefill.forget()

    def weights_changed(self) -> None:
        """The model's weights were written (a load, adapters copied in): what was computed with the
        old ones (the trunk's and a shared beginning's keys and values) is computed again."""
        self.prefill.forget()

    def _least_rows(self, weights_first: bool) -> int:
        """The rows a product computes at least, so that each comes out alike whatever the others
        are: measured on the CPU (``invariance.py``), 1 elsewhere. The model's linear modules are
        marked to compute more rows than the probe's by chunks (``mark_rows``). The decode step's
        products go as W·xᵀ with ``weights_first`` in float32 (an adapter's A and B as x·Wᵀ), any
        other as x·Wᵀ."""
        if self.device.type != "cpu" or not self.invariant:
            return 1
        shapes = product_shapes(self.model)
        across = least_rows(shapes, self.dtype, weights_first=False)
        first = least_rows(shapes, self.dtype, weights_first=True)
        mark_rows(self.model, across, first)
        if not weights_first or self.dtype != torch.float32:
            return across
        adapted = any(isinstance(m, LoraLinear) for m in self.model.modules())
        return max(across, first) if adapted else first

    def generate(
        self, prompt: Sequence[int], seeds: Sequence[int], params: SamplingParams
    ) -> list[Completion]:
        """``len(seeds)`` samples of ``prompt``: one shared prefill, then one batched step per token."""
        return self.generate_many([(prompt, seeds)], params)[0]

    @torch.no_grad()
    def generate_many(
        self,
        groups: Sequence[tuple[Sequence[int], Sequence[int]]],
        params: SamplingParams,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
        joining: JoiningGroups | None = None,
        limits: Sequence[int] | None = None,
        shared: Sequence[int] = (),
        positions: int = 0,
    ) -> list[list[Completion]]:
        """For each (prompt, seeds), ``len(seeds)`` samples of the prompt, decoded together
        (``decode_loop.py``): each sample a row in a slot of the engine's cache, admitted as slots free
        up (its prompt prefilled with the others admitted with it, ``Prefill.many``), one step a token.

        ``ended(i, completions)`` is told each group ``i`` (an index into ``groups``) as soon as
        every sample of it has ended, once, in the order the groups end (ties in index order; a group
        of no seeds first, with []), with what the call returns for it. ``stopped()`` is asked between
        two decode steps for groups to stop now (one already ended is ignored): a stopped group's rows
        leave the batch at once, it is never told to ``ended``, and the call returns [] for it.
        ``joining(room)`` is asked between two decode steps for more groups of at most ``room`` prompt
        tokens and at least one seed: each joins the call (continuous batching across a worker's
        assignments), its rows admitted as slots free up, told to ``ended`` and returned like the
        call's own, at the indices after them in the order they came. ``limits``: each group's own
        token limit, at most ``params.max_new_tokens`` (the episodes' turns of one call); a sample
        cut at its limit is the first tokens of the one a larger limit gives. ``shared``: a beginning
        the caller knows its prompts share, computed once and read by each that begins with it
        (``Prefill.many``); ``positions``: a row's positions to hold at least (for groups that will
        join with longer prompts: an episode's later turns). None of these changes any sample."""
        steps = params.max_new_tokens
        own = self._limits(groups, steps, limits)
        sizes = [len(seeds) for _, seeds in groups]
        if ended is not None:
            for i in [i for i, n in enumerate(sizes) if n == 0]:  # ended before any step
                ended(i, [])
        if not any(sizes):
            return [[] for _ in sizes]
        longest = max(len(p) + n for (p, s), n in zip(groups, own, strict=True) if s)
        loop = DecodeLoop(
            self._reserve(longest, positions),
            functools.partial(self.prefill.many, shared=list(shared)),
            self._run_step,
            [list(p) for p, _ in groups],
            sizes,
            self._uniforms([seed for _, group_seeds in groups for seed in group_seeds], steps),
            self.eos_id,
            params.temperature,
            params.top_p,
            self.readback,
            bucketed=self.buckets,
            least=self._least_rows(weights_first_here(self.device)),
            limits=own,
            pace=self.pace,
        )
        joins = None if joining is None else functools.partial(self._joins, joining, steps)
        done = loop.run(None if ended is None else functools.partial(_tell, ended), stopped, joins)
        self.last_call = loop.stats
        return [[Completion(t, lp, f) for t, lp, f in done.get(i, [])] for i in range(len(loop.sizes))]

    def _limits(
        self, groups: Sequence[tuple[Sequence[int], Sequence[int]]], steps: int, limits: Sequence[int] | None
    ) -> list[int]:
        """Each group's token limit (the call's where not given), each checked with its prompt."""
        own = list(limits) if limits is not None else [steps] * len(groups)
        if len(own) != len(groups) or not all(1 <= n <= steps for n in own):
            raise ValueError(f"token limits {own} for {len(groups)} groups of at most {steps} new tokens")
        for (prompt, _), n in zip(groups, own, strict=True):
            self._check(prompt, n)
        return own

    def _joins(
        self, joining: JoiningGroups, steps: int, room: int
    ) -> list[tuple[Sequence[int], Tensor, int]]:
        """The groups `joining` gives, each with its rows' uniforms and its token limit, for a call of
        `steps` new tokens."""
        out: list[tuple[Sequence[int], Tensor, int]] = []
        for prompt, seeds, *own in joining(room):
            limit = own[0] if own else steps
            self._check(prompt, limit)
            out.append((prompt, self._uniforms(seeds, steps), limit))
        return out

    def _uniforms(self, seeds: Sequence[int], steps: int) -> Tensor:
        """[rows, steps]: the uniforms each seed's generator draws, one a step."""
        drawn = [
            torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds
        ]
        return (torch.stack(drawn) if drawn else torch.zeros(0, steps, dtype=torch.float64)).to(self.device)

    def _run_step(self, tokens: Tensor, positions: Tensor, write_at: Tensor, width: int, live: int) -> Tensor:
        assert self._cache is not None
        return self.runner(self._cache.keys, self._cache.values, tokens, positions, write_at, width, live)

    def _slots(self, length: int) -> SlotCache:
        """The cache of ``self.rows`` slots, allocated once; made longer (in steps of
        ``LENGTH_STEP``, at most the model's positions) when a call needs more positions a row."""
        if self._cache is not None and self._cache.length >= length:
            return self._cache
        length = min(-(-length // LENGTH_STEP) * LENGTH_STEP, self.model.cfg.max_position)
        self._cache = None  # the old one freed before the new one is made
        self._cache = self.allocate(length)
        return self._cache

    def _reserve(self, needed: int, hinted: int) -> SlotCache:
        """The cache for rows of `needed` positions, of `hinted` where that fits the device (rows that
        will join with longer prompts); else of what is needed, the error naming what does not fit."""
        wanted = min(max(needed, hinted), self.model.cfg.max_position)
        try:
            return self._slots(wanted)
        except ValueError:
            if wanted <= needed:
                raise
            log.info("engine_cache_hint_refused", rows=self.rows, positions=wanted, needed=needed)
            return self._slots(needed)

    def allocate(self, length: int) -> SlotCache:
        """A slot cache of ``self.rows`` slots of ``length`` positions, or the error naming the rows
        and positions asked when it does not fit the device."""
        dtype = cache_dtype(self.dtype, self.device, self.invariant)
        need = cache_bytes(self.model.cfg, self.rows, length, dtype)
        room = device_room(self.device)
        if room is not None and need > room:
            raise ValueError(
                f"the engine's KV cache of {self.rows} rows x {length} positions needs "
                f"{need / 2**30:.2f} GiB, more than the {room / 2**30:.2f} GiB free on {self.device}: "
                "fewer rollout.engine_rows (or shorter prompts and rollout.max_new_tokens)"
            )
        cache = SlotCache(self.model.cfg, self.rows, length, dtype, self.device)
        if self.device.type == "cuda":  # written in place by the captured graphs: fixed addresses
            for tensor in (*cache.keys, *cache.values):
                torch._dynamo.mark_static_address(tensor)
        return cache

    @torch.no_grad()
    def warm_up(self, length: int = LENGTH_STEP) -> float:
        """Compile (or record) the decode step for every row bucket now, not in a period: the
        seconds it took (0 for an eager engine)."""
        if not self.runner.compiled:
            return 0.0
        begin = time.perf_counter()
        cache = self._slots(min(length, self.model.cfg.max_position))
        least = self._least_rows(weights_first_here(self.device))
        sizes = sorted({step_rows(n, self.rows, least) for n in range(1, self.rows + 1)})
        for b in sizes:  # three tensors apart, as a call passes them (aliases would be guarded on)
            tokens = torch.zeros(b, dtype=torch.long, device=self.device)
            positions = torch.zeros_like(tokens)
            spare = torch.full_like(tokens, cache.spare)
            self.runner(cache.keys, cache.values, tokens, positions, spare, WIDTH_STEP)
        took = time.perf_counter() - begin
        log.info("engine_warmed_up", seconds=round(took, 2), buckets=sizes, compiled=self.runner.compiled)
        return took

    def _check(self, prompt: Sequence[int], steps: int) -> None:
        max_position = self.model.cfg.max_position
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        if len(prompt) + steps > max_position:
            raise ValueError(
                f"prompt length {len(prompt)} + max_new_tokens {steps} exceeds max_position {max_position}"
            )


def _tell(ended: GroupEnded, group: int, rows: list[tuple[list[int], list[float], bool]]) -> None:
    ended(group, [Completion(t, lp, f) for t, lp, f in rows])


def device_room(device: torch.device) -> int | None:
    """The bytes a cache may take on ``device``: nine tenths of a GPU's free memory, half the host's
    available memory for the CPU; None where it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.9)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as info:
                fields = dict(line.split(":", 1) for line in info)
            return int(fields["MemAvailable"].split()[0]) * 1024 // 2
        except (OSError, KeyError, ValueError):
            return None
    return None
