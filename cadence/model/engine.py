"""The built-in generation engine: batched sampling of one or several prompts with a KV cache.

The log-prob recorded with each token is that of the distribution it was sampled from before top-p:
log softmax(logits / T), the learner's (ops/logprobs.py), at T = 1 when greedy.

Invariant: sample ``i`` of a ``generate`` call draws its randomness only from a generator seeded
with ``seeds[i]`` (one uniform per step, drawn up front), so it is the same sample whatever the
batch size and the other seeds; ``sample_seed`` makes that seed a pure function of
(run seed, period, prompt id, sample index), so a prompt regenerated elsewhere gives the same group.
A prompt that begins with the engine's ``trunk`` (the chat template's beginning every prompt shares)
reads the trunk's keys and values, computed once for each version loaded, and computes only its own
tokens; any other prompt is computed whole. When every prompt of one call begins with a longer common
beginning (the episodes of a batch: one opening, a system prompt and worked examples, for all), that
beginning is computed once for the call and read by each. The prompts of a batch are computed together, one after
another in one row, each attending only the trunk and itself at the positions it has alone, so a
prompt's prefill is what it computes alone up to float summation order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from cadence.model.decode_groups import DecodeGroups
from cadence.model.tokenizer import TextTokenizer
from cadence.model.transformer import KVCache, Transformer, load_hf_state_dict
from cadence.ops.logprobs import tempered
from cadence.ops.packing import fill_in_order, shared_trunk


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


def sample_seed(run_seed: int, period: int, prompt_id: int, index: int) -> int:
    """A stable 63-bit seed for one sample, independent of Python's hash randomisation."""
    key = f"{run_seed}:{period}:{prompt_id}:{index}".encode()
    digest = hashlib.blake2b(key, digest_size=8, person=b"cadence-sample").digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


MIN_TRUNK = 8  # a shorter common beginning is computed with each prompt
# the prompts' tokens a prefill forward takes at most: the attention of one row grows with its square,
# its matrix products only with its length (at 1024 SmolLM2's attention is about 1 % of the forward)
PREFILL_ROW_TOKENS = 1024


def prompt_trunk(tokenizer: TextTokenizer) -> list[int]:
    """The beginning every prompt's encoding shares: what the chat template puts before the user's
    text (its system prompt), found as the common beginning of two unlike prompts (two digits: every
    tokenizer here has them). A prompt that does not begin with it (a text that merges with the
    template's last tokens) is simply computed whole."""
    first = tokenizer.encode_prompt("0")
    return first[: shared_trunk([first, tokenizer.encode_prompt("1")])]


class TorchEngine:
    """Generates with a ``Transformer`` in this process, its weights and activations in ``dtype``
    (a version of another dtype is rounded on load); the logits are sampled in float32."""

    def __init__(
        self,
        model: Transformer,
        eos_id: int,
        device: str = "cpu",
        trunk: Sequence[int] = (),
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model.to(device=device, dtype=dtype).eval()
        self.eos_id = eos_id
        self.device = torch.device(device)
        self.trunk = list(trunk) if len(trunk) >= MIN_TRUNK else []
        self._trunk_kv: KVCache | None = None  # of the weights loaded now

    def load_state_dict(self, state: Mapping[str, Tensor], share: bool = False) -> None:
        """Take HF-named weights (strict; a tied head may be absent), copied into the model's own
        tensors. With ``share``, when every tensor has the dtype and device of the weight it replaces,
        the tensors themselves become the weights instead (no copy of the whole model): the caller
        leaves them unchanged until the next load."""
        with torch.no_grad():
            own = self.model.state_dict()
            fits = share and all(
                key in own and t.dtype == own[key].dtype and t.device == own[key].device
                for key, t in state.items()
            )
            load_hf_state_dict(self.model, state, assign=fits)
        self._trunk_kv = None

    def _begins_with_trunk(self, prompt: Sequence[int]) -> bool:
        n = len(self.trunk)
        return n > 0 and len(prompt) > n and list(prompt[:n]) == self.trunk

    def _trunk_cache(self) -> KVCache:
        """The trunk's keys and values under the weights loaded now (computed on first use)."""
        if self._trunk_kv is None:
            self._trunk_kv = self._extend(KVCache(), self.trunk)
        return self._trunk_kv

    def _extend(self, cache: KVCache, ids: Sequence[int]) -> KVCache:
        """``cache`` with the keys and values of ``ids`` after its own (no logits computed)."""
        row = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        self.model(row, cache=cache, logits_at=torch.zeros_like(row, dtype=torch.bool))
        return cache

    def _prefill_many(self, prompts: Sequence[Sequence[int]]) -> list[tuple[KVCache, Tensor]]:
        """Each prompt's batch-1 cache and its last position's logits [1, V]. A prompt that begins
        with the trunk reads the trunk's keys and values and computes only its own tokens; any other
        is computed whole. The tokens computed lie one prompt after another in rows of at most
        ``PREFILL_ROW_TOKENS`` (a prompt longer than that alone in its row), one forward a row: one
        matrix product for every prompt's tokens instead of one a prompt."""
        out: dict[int, tuple[KVCache, Tensor]] = {}
        trunked = [self._begins_with_trunk(p) for p in prompts]
        common = shared_trunk(prompts)
        plan: list[tuple[list[int], int, KVCache | None]]
        if common >= MIN_TRUNK and common > (len(self.trunk) if all(trunked) else 0):
            # every prompt of the call begins alike beyond the trunk (an episode's opening and turns)
            plan = [(list(range(len(prompts))), common, self._prefix_cache(prompts[0][:common]))]
        else:
            plan = [
                ([i for i, t in enumerate(trunked) if t], len(self.trunk), None),
                ([i for i, t in enumerate(trunked) if not t], 0, None),
            ]
        for indices, cut, prefix in plan:
            for row in fill_in_order([len(prompts[i]) - cut for i in indices], PREFILL_ROW_TOKENS):
                picked = [indices[j] for j in row]
                start = prefix or (self._trunk_cache() if cut else KVCache())
                caches, logits = self._prefill_segments(start, [list(prompts[i][cut:]) for i in picked])
                out |= {i: (c, last) for i, c, last in zip(picked, caches, logits.split(1), strict=True)}
        return [out[i] for i in range(len(prompts))]

    def _prefix_cache(self, prefix: Sequence[int]) -> KVCache:
        """The keys and values of ``prefix`` (the trunk's read, not computed again, when it begins
        with it), for the prompts of one call that all begin with it."""
        n = len(self.trunk) if self._begins_with_trunk(prefix) else 0
        return self._extend(self._trunk_cache().fork() if n else KVCache(), prefix[n:])

    def _prefill_segments(self, start: KVCache, own: list[list[int]]) -> tuple[list[KVCache], Tensor]:
        """Several prompts' tokens after the batch-1 cache ``start`` (the trunk, or empty), as
        segments of one row, each at the positions it has alone and attending ``start`` and its own
        earlier tokens only: a batch-1 cache for each (``start``'s entries, then its own) and the
        logits [S, V] of each one's last token."""
        n, device = start.length, self.device
        sizes = torch.tensor([len(o) for o in own], device=device)
        segment = torch.repeat_interleave(torch.arange(len(own), device=device), sizes)  # [T]
        local = torch.arange(len(segment), device=device) - (sizes.cumsum(0) - sizes)[segment]
        sees = (segment[:, None] == segment[None, :]) & (local[:, None] >= local[None, :])
        mask = torch.cat([sees.new_ones(len(segment), n), sees], dim=1).view(1, 1, len(segment), -1)
        ids = torch.tensor([[t for o in own for t in o]], dtype=torch.long, device=device)
        last = (local == sizes[segment] - 1).unsqueeze(0)
        cache = start.fork()
        logits = self.model(ids, (n + local).unsqueeze(0), mask, cache, logits_at=last)
        return cache.segments(n, [len(o) for o in own]), logits

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
    ) -> list[list[Completion]]:
        """For each (prompt, seeds), ``len(seeds)`` samples of the prompt: the prompts' prefill
        (``_prefill_many``), then one batched step per token over every sample of every prompt (a
        decode step reads every weight once, however many rows it has). Prompts of different lengths
        share the cache with gaps after the shorter ones, masked out; each row keeps its own
        positions.

        ``ended(i, completions)`` is told each group ``i`` (an index into ``groups``) as soon as
        every sample of it has ended, once, in the order the groups end (ties in index order; a group
        of no seeds first, with []), with what the call returns for it. ``stopped()`` is asked between
        two decode steps for groups to stop now (one already ended is ignored): a stopped group's rows
        leave the batch at once, it is never told to ``ended``, and the call returns [] for it. Neither
        changes any sample."""
        steps = params.max_new_tokens
        for prompt, _ in groups:
            self._check(prompt, steps)
        sizes = [len(seeds) for _, seeds in groups]
        if ended is not None:
            for i in [i for i, n in enumerate(sizes) if n == 0]:  # ended before any step
                ended(i, [])
        groups = [(p, s) for p, s in groups if s]
        if not groups:
            return [[] for _ in sizes]
        seeds = [seed for _, group_seeds in groups for seed in group_seeds]
        uniforms = torch.stack(
            [
                torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                for s in seeds
            ]
        ).to(self.device)
        prefilled = self._prefill_many([prompt for prompt, _ in groups])
        caches = [cache for cache, _ in prefilled]
        firsts = [logits.expand(len(s), -1) for (_, logits), (_, s) in zip(prefilled, groups, strict=True)]
        repeats = [len(s) for _, s in groups]
        cache = KVCache.stacked(caches, repeats, capacity=max(c.length for c in caches) + steps)
        lengths = torch.tensor([len(p) for p, s in groups for _ in s], device=self.device)
        tracked = DecodeGroups(sizes, self.device)
        tokens, logprobs = self._decode(
            torch.cat(firsts), cache, lengths, uniforms, params, tracked, ended, stopped
        )
        done = iter(self._completions(tokens, logprobs))
        out = [[next(done) for _ in range(n)] for n in sizes]
        return [[] if i in tracked.stopped else group for i, group in enumerate(out)]

    def _check(self, prompt: Sequence[int], steps: int) -> None:
        max_position = self.model.cfg.max_position
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        if len(prompt) + steps > max_position:
            raise ValueError(
                f"prompt length {len(prompt)} + max_new_tokens {steps} exceeds max_position {max_position}"
            )

    def _decode(
        self,
        logits: Tensor,
        cache: KVCache,
        lengths: Tensor,
        uniforms: Tensor,
        params: SamplingParams,
        groups: DecodeGroups,
        ended: GroupEnded | None,
        stopped: StoppedGroups | None,
    ) -> tuple[Tensor, Tensor]:
        """Sample every row from its prompt's last logits on, one batched forward a token: each row's
        tokens and log-probs [n, steps] (-1 and undefined at steps it did not run). Rows whose prompts
        are shorter than the cache's prompt part attend only their own prompt slots. Once a quarter of
        the rows still computed have ended on eos, they leave the batch (and the cache): a long sample
        does not make every finished one compute on to its end. A stopped group's rows leave at once.
        Each group is told to ``ended`` at the step its last row ends (after the loop when that is the
        last step, or when every row left has ended)."""
        n, steps, width = logits.shape[0], params.max_new_tokens, cache.length
        gaps = bool((lengths != width).any())
        prompt_slots = torch.arange(width, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)  # [n, W]
        tokens = torch.full((n, steps), -1, dtype=torch.long, device=self.device)
        logprobs = torch.empty(n, steps, dtype=torch.float32, device=self.device)
        live = torch.arange(n, device=self.device)  # the rows still computed, in the batch's order
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)  # of the live rows: ended on eos
        for step in range(steps):
            token = self._sample(logits, uniforms[live, step], params)
            tokens[live, step] = token
            picked = torch.log_softmax(tempered(logits, params.temperature), dim=-1).gather(1, token[:, None])
            logprobs[live, step] = picked.squeeze(1)
            now = (token == self.eos_id) & ~finished
            finished |= now
            if step + 1 == steps or bool(finished.all()):
                break
            if ended is not None or stopped is not None:  # a group ended is no longer stopped
                self._tell(ended, groups, groups.take_ended(live, now), tokens, logprobs)
            gone = groups.stopped_rows(live) if stopped is not None and groups.stop(stopped()) else None
            if gone is not None and bool((finished | gone).all()):
                break  # every row left has ended or stopped
            keep = _kept_rows(finished, gone)
            if keep is not None:  # the other rows leave the batch
                live, token, lengths, prompt_slots = (
                    live[keep],
                    token[keep],
                    lengths[keep],
                    prompt_slots[keep],
                )
                cache.keep_rows(keep)
                finished = finished[keep]
            if not gaps:  # every row at the cache's own positions: the plain causal step
                logits = self.model(token[:, None], cache=cache)[:, -1]
                continue
            m = len(live)
            seen = torch.cat([prompt_slots, prompt_slots.new_ones((m, step + 1))], dim=1)
            positions = (lengths + step).unsqueeze(1)  # [m, 1]: the row's own next position
            logits = self.model(token[:, None], positions, seen.view(m, 1, 1, -1), cache)[:, -1]
        self._tell(ended, groups, groups.take_rest(), tokens, logprobs)
        return tokens, logprobs

    def _tell(
        self,
        ended: GroupEnded | None,
        groups: DecodeGroups,
        told: list[int],
        tokens: Tensor,
        logprobs: Tensor,
    ) -> None:
        """Tell ``ended`` each group of ``told`` with its completions (the final ones: a row's tokens
        after its eos, sampled while it stays in the batch, are cut)."""
        if ended is not None:
            for g in told:
                ended(g, self._completions(tokens[groups.rows(g)], logprobs[groups.rows(g)]))

    def _completions(self, tokens: Tensor, logprobs: Tensor) -> list[Completion]:
        """The completions of rows' tokens and log-probs [rows, steps]."""
        return [self._completion(row, lp) for row, lp in zip(tokens.tolist(), logprobs.tolist(), strict=True)]

    def _completion(self, row: list[int], logprobs: list[float]) -> Completion:
        # a row may be sampled on after its eos (until it leaves the batch); steps never run hold -1
        finished = self.eos_id in row
        length = row.index(self.eos_id) + 1 if finished else len(row)
        return Completion(tokens=row[:length], logprobs=logprobs[:length], finished=finished)

    @staticmethod
    def _sample(logits: Tensor, uniforms: Tensor, params: SamplingParams) -> Tensor:
        """One token per row by inverse CDF over the tempered, nucleus-filtered distribution: in the
        vocabulary's order without a nucleus (no sort: sorting 49k probabilities a row costs more than
        the decode step's head), in descending order of probability with one."""
        if params.temperature == 0.0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p >= 1.0:
            return _inverse_cdf(probs, uniforms)
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        keep = (probs > 0) & ((probs.cumsum(dim=-1) - probs) < params.top_p)  # the top token always stays
        return order.gather(1, _inverse_cdf(probs.masked_fill(~keep, 0.0), uniforms).unsqueeze(1)).squeeze(1)


def _kept_rows(finished: Tensor, gone: Tensor | None) -> Tensor | None:
    """The live rows that stay in the batch, or None when all do: without the ended ones once a quarter
    of them have ended, and without a stopped group's (`gone`) at once."""
    drop = finished if 4 * int(finished.sum()) >= len(finished) else None
    if gone is not None:
        drop = gone if drop is None else drop | gone
    return None if drop is None else (~drop).nonzero().squeeze(1)


def _inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The index whose cumulative probability first exceeds ``uniforms`` [n] (in [0, 1)) times the
    row's total: never an index of probability 0, since the cumulative sum does not rise there."""
    cdf = probs.double().cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return torch.minimum(index, (probs > 0).long().cumsum(dim=-1).argmax(dim=-1))
