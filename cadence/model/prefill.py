"""The built-in engine's prefill: prompts' keys and values and their last logits, the chat template's
beginning (the trunk) and a beginning the caller names read rather than computed again.

```
 prompts ─► begins with `shared` (named, longer than the trunk)? ─► its cache (kept until a load), then its own
          └► begins with the trunk? ─► the trunk's cache (once a version), then its own tokens
          └► else computed whole
        each group's own tokens one prompt after another in rows of at most PREFILL_ROW_TOKENS,
        one forward a row, each prompt attending what it begins with and itself
```

Invariant: how a prompt is computed depends on it and ``shared`` alone, never on the prompts beside
it; the prompts admitted together are computed at the positions each has alone, so a prompt's prefill
is what it computes alone, bit for bit (``invariance.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cadence.model.transformer import KVCache, Transformer
from cadence.ops.block_attention import prompts_mask
from cadence.ops.packing import fill_in_order

MIN_TRUNK = 8  # a shorter common beginning is computed with each prompt
# the prompts' tokens a prefill forward takes at most: the attention of one row grows with its square,
# its matrix products only with its length (at 1024 SmolLM2's attention is about 1 % of the forward)
PREFILL_ROW_TOKENS = 1024


class Prefill:
    """Prefills for ``model`` on ``device``; ``trunk``: the beginning every prompt shares (kept only
    from ``MIN_TRUNK`` tokens); ``least()``: the rows a product computes at least (the engine's
    measure, ``invariance.py``)."""

    def __init__(
        self, model: Transformer, device: torch.device, trunk: Sequence[int], least: Callable[[], int]
    ) -> None:
        self.model = model
        self.device = device
        self.trunk = list(trunk) if len(trunk) >= MIN_TRUNK else []
        self.least = least
        self.trunk_kv: KVCache | None = None  # of the weights loaded now
        self._shared_kv: tuple[tuple[int, ...], KVCache] | None = None  # the last shared beginning's

    def forget(self) -> None:
        """The weights changed: the trunk's and a shared beginning's keys and values are computed again."""
        self.trunk_kv = None
        self._shared_kv = None

    def begins_with_trunk(self, prompt: Sequence[int]) -> bool:
        n = len(self.trunk)
        return n > 0 and len(prompt) > n and list(prompt[:n]) == self.trunk

    def trunk_cache(self) -> KVCache:
        """The trunk's keys and values under the weights loaded now (computed on first use)."""
        if self.trunk_kv is None:
            self.trunk_kv = self.extend(KVCache(), self.trunk)
        return self.trunk_kv

    def extend(self, cache: KVCache, ids: Sequence[int]) -> KVCache:
        """``cache`` with the keys and values of ``ids`` after its own (no logits computed)."""
        row = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        self.model(row, cache=cache, logits_at=torch.zeros_like(row, dtype=torch.bool))
        return cache

    def many(
        self, prompts: Sequence[Sequence[int]], shared: Sequence[int] = ()
    ) -> list[tuple[KVCache, Tensor]]:
        """Each prompt's batch-1 cache and its last position's logits [1, V]. A prompt that begins
        with ``shared`` (of at least ``MIN_TRUNK`` tokens, beyond the trunk) and is longer reads its
        keys and values, computed once here, and computes only its own tokens; else one that begins
        with the trunk reads the trunk's; any other is computed whole. So how a prompt is computed
        depends on it and ``shared`` alone, never on the prompts beside it. The tokens computed lie
        one prompt after another in rows of at most ``PREFILL_ROW_TOKENS`` (a prompt longer than
        that alone in its row), one forward a row: one matrix product for every prompt's tokens
        instead of one a prompt."""
        out: dict[int, tuple[KVCache, Tensor]] = {}
        n = len(shared) if len(shared) >= MIN_TRUNK and len(shared) > len(self.trunk) else 0
        on_shared = [bool(n) and len(p) > n and list(p[:n]) == list(shared) for p in prompts]
        trunked = [not s and self.begins_with_trunk(p) for p, s in zip(prompts, on_shared, strict=True)]
        whole = [i for i, (s, t) in enumerate(zip(on_shared, trunked, strict=True)) if not s and not t]
        plan: list[tuple[list[int], int, KVCache | None]] = [
            (
                [i for i, s in enumerate(on_shared) if s],
                n,
                self._prefix_cache(shared) if any(on_shared) else None,
            ),
            ([i for i, t in enumerate(trunked) if t], len(self.trunk), None),
            (whole, 0, None),
        ]
        for indices, cut, prefix in plan:
            for row in fill_in_order([len(prompts[i]) - cut for i in indices], PREFILL_ROW_TOKENS):
                picked = [indices[j] for j in row]
                start = prefix or (self.trunk_cache() if cut else KVCache())
                caches, logits = self._segments(start, [list(prompts[i][cut:]) for i in picked])
                out |= {i: (c, last) for i, c, last in zip(picked, caches, logits.split(1), strict=True)}
        return [out[i] for i in range(len(prompts))]

    def _prefix_cache(self, prefix: Sequence[int]) -> KVCache:
        """The keys and values of ``prefix`` (the trunk's read, not computed again, when it begins
        with it), for the prompts that begin with it; the last one is kept until the next load (an
        episode batch's admissions read it again and again)."""
        key = tuple(prefix)
        if self._shared_kv is None or self._shared_kv[0] != key:
            n = len(self.trunk) if self.begins_with_trunk(prefix) else 0
            self._shared_kv = (key, self.extend(self.trunk_cache().fork() if n else KVCache(), prefix[n:]))
        return self._shared_kv[1]

    def _segments(self, start: KVCache, own: list[list[int]]) -> tuple[list[KVCache], Tensor]:
        """Several prompts' tokens after the batch-1 cache ``start`` (the trunk, or empty), as
        segments of one row, each at the positions it has alone and attending ``start`` and its own
        earlier tokens only: a batch-1 cache for each (``start``'s entries, then its own) and the
        logits [S, V] of each one's last token. Fewer tokens than the products need to give each
        row alike whatever the others are (``invariance.py``) are padded with a segment of their
        own, which no prompt sees; the head reads as many rows (the first ones beside the lasts)."""
        n, device = start.length, self.device
        least = self.least()
        tokens = sum(len(o) for o in own)
        rows = own + ([[0] * (least - tokens)] if tokens < least else [])
        sizes = torch.tensor([len(o) for o in rows], device=device)
        segment = torch.repeat_interleave(torch.arange(len(rows), device=device), sizes)  # [T]
        local = torch.arange(len(segment), device=device) - (sizes.cumsum(0) - sizes)[segment]
        mask = prompts_mask([len(o) for o in rows], n)  # by blocks: no [T, T] tensor
        ids = torch.tensor([[t for o in rows for t in o]], dtype=torch.long, device=device)
        last = (local == sizes[segment] - 1) & (segment < len(own))
        read = last | (torch.cumsum(~last, 0) <= least - len(own))  # at least `least` rows for the head
        cache = start.fork()
        logits = self.model(ids, (n + local).unsqueeze(0), mask, cache, logits_at=read.unsqueeze(0))
        return cache.segments(n, [len(o) for o in own]), logits[last[read]]
