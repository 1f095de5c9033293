"""The built-in engine's loop for one ``generate_many`` call: rows admitted into the cache's slots as
slots free up, one fixed-shape step a token for every slot held, rows retired and groups told as they
end.

```
 pending rows (group by group) ──admit: prefill their prompts, copy into free slots, first token──┐
       ▲                                                                                         ▼
       │                       slots 0..B-1 (B: a row bucket) ──step: a token each, on the device─┤
       │                                                                                         │
       └── free slots ◄── retire: rows ended on eos or at their limit, groups told in the order ◄┘
                          they ended (read back every ``readback`` steps); stopped groups dropped
```

Invariant: a row's token at step ``s`` is sampled from its own logits and the uniform its seed drew
for ``s``, whatever slot it holds, which rows share its steps or when it was admitted: a sample
depends only on its prompt, its seed and the weights. State that changes every step (tokens,
positions, counts, which rows still sample) lives on the device; the host reads it back only at a
readback (every ``readback`` steps, and when the rows it knows of may all have ended), where it
retires, stops and admits. An ended or padded row writes only to the spare position and the spare
column of the output, which nothing reads.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch
from torch import Tensor

from cadence.model.sampler import sample
from cadence.model.slots import SlotCache, step_rows, width_bucket
from cadence.model.transformer import KVCache

# What the loop asks of the engine.
Prefill = Callable[[Sequence[Sequence[int]]], list[tuple[KVCache, Tensor]]]
Step = Callable[[Tensor, Tensor, Tensor, int, int], Tensor]
"""(tokens, positions, write_at, width, live) -> logits [rows, V]: rows from ``live`` on only pad."""
Told = Callable[[int, list[tuple[list[int], list[float], bool]]], None]
Stopped = Callable[[], Collection[int]]
Joins = Callable[[int], Sequence[tuple[Sequence[int], Tensor, int]]]
"""Asked at a readback, with the longest prompt a row of the call's token limit still fits, for groups
to join the call: each its prompt, its rows' uniforms [rows, steps] and its own token limit (at most
the call's; a prompt may be longer by what its limit is shorter); they take the indices after the
call's groups."""


@dataclass
class LoopStats:
    """What one call computed: the rows of each decode step (its bucket), and the prompts' tokens
    each admission prefilled."""

    steps: list[int] = field(default_factory=list)
    live: list[int] = field(default_factory=list)  # rows still sampling at each step (at most)
    attending: list[int] = field(default_factory=list)  # the slots each step attends and samples
    admissions: list[int] = field(default_factory=list)  # rows admitted at each admission
    first_token_s: float = 0.0  # from the call's start to its first rows' first tokens


class DecodeLoop:
    """One call's rows: ``prompts`` and each one's ``seeds`` (its rows, group after group);
    ``uniforms`` [rows, steps] drawn by the caller; ``eos``, ``steps`` (the call's token limit; a
    group's own, at most that, in ``limits``), ``temperature`` and ``top_p`` as the call's params. ``bucketed``: a step computes a bucket of
    rows (few shapes, for a compiled step or a GPU's); otherwise exactly the rows held, the highest
    moved down into a free slot below whenever one frees (eager on the CPU, where a padded row costs
    its full share of the step); either way at least ``least`` rows (as many as the slots at most),
    from which each row's products come out alike whatever the others are (``invariance.py``)."""

    def __init__(
        self,
        cache: SlotCache,
        prefill: Prefill,
        step: Step,
        prompts: Sequence[Sequence[int]],
        sizes: Sequence[int],
        uniforms: Tensor,
        eos: int,
        temperature: float,
        top_p: float,
        readback: int = 1,
        bucketed: bool = True,
        least: int = 1,
        limits: Sequence[int] | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        self.cache, self.prefill, self.step = cache, prefill, step
        self.prompts, self.sizes = prompts, list(sizes)
        self.eos, self.temperature, self.top_p = eos, temperature, top_p
        self.readback = max(1, readback)
        self.pace = pace  # asked at every readback, in the generating thread (a worker's thread budget)
        self.bucket = functools.partial(step_rows, slots=cache.slots, least=least, bucketed=bucketed)
        self.bucketed = bucketed
        device = cache.device
        n, steps = uniforms.shape
        self.n, self.limit = n, steps
        self.group_of = [g for g, size in enumerate(sizes) for _ in range(size)]
        own = list(limits) if limits is not None else [steps] * len(sizes)  # checked by the engine
        self.row_limit = [own[g] for g in self.group_of]  # each row's own token limit
        starts = list(accumulate(sizes, initial=0))
        self.rows_of = [list(range(start, start + size)) for start, size in zip(starts, sizes, strict=False)]
        # one spare row (n) and one spare column (steps) take what ended or padded rows write
        self.uniforms = torch.cat([uniforms, uniforms.new_zeros(1, steps)])
        self.out_tokens = torch.full((n + 1, steps + 1), -1, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(n + 1, steps + 1, dtype=torch.float32, device=device)
        slots = cache.slots
        self.token = torch.zeros(slots, dtype=torch.long, device=device)
        self.position = torch.zeros(slots, dtype=torch.long, device=device)
        self.count = torch.zeros(slots, dtype=torch.long, device=device)
        self.alive = torch.zeros(slots, dtype=torch.bool, device=device)
        self.row = torch.full((slots,), n, dtype=torch.long, device=device)
        self.ended_at = torch.zeros(slots, dtype=torch.long, device=device)
        self.cap = torch.full((slots,), steps, dtype=torch.long, device=device)  # its row's limit
        self.pending: deque[int] = deque(r for r in range(n))
        self.held: dict[int, int] = {}  # slot -> row
        self.reach: dict[int, int] = {}  # slot -> its position at admission minus the step then
        self.admitted: dict[int, int] = {}  # slot -> the step its row was admitted at
        self.prefilled: dict[int, tuple[KVCache, Tensor]] = {}
        self.left = list(sizes)  # rows of each group not yet ended
        self.ended_step = [0] * len(sizes)
        self.open = {g for g, size in enumerate(sizes) if size}
        self.counts = [0] * n
        self.done: dict[int, list[tuple[list[int], list[float], bool]]] = {}
        self.stats = LoopStats()
        self.clock = 0  # decode steps taken

    def run(
        self, told: Told | None, stopped: Stopped | None, joins: Joins | None = None
    ) -> dict[int, list[tuple[list[int], list[float], bool]]]:
        """Decode every row to its end (or its group's stop); each group ended, told to ``told`` as
        it ends; returns every ended group's (tokens, log-probs, ended on eos) a row. ``joins`` is
        asked at every readback for groups to add (``join``), once more before the call returns."""
        begin = time.perf_counter()
        self._admit()
        self.token.sum().item()  # the first tokens are sampled (a device computes asynchronously)
        self.stats.first_token_s = time.perf_counter() - begin
        since = self.readback  # rows that end on their first token are told before any step
        while self.held or self.pending or self._joined(joins):
            if since >= self.readback or not self._may_run():
                since = 0
                if self.pace is not None:
                    self.pace()
                self._retire(told)
                if stopped is not None and (self.held or self.pending) and self.open:
                    self._stop(stopped())
                self._joined(joins)
                self._admit()
                self._compact()
                if not self.held:
                    if self.pending:
                        continue
                    break
            self._step()
            since += 1
        self._retire(told)
        return self.done

    def _joined(self, joins: Joins | None) -> bool:
        """Whether ``joins`` gave groups to add (each added)."""
        if joins is None:
            return False
        groups = joins(self.cache.length - self.limit)
        for prompt, uniforms, limit in groups:
            self.join(prompt, uniforms, limit)
        return bool(groups)

    def join(self, prompt: Sequence[int], uniforms: Tensor, limit: int | None = None) -> int:
        """Add a group to the call: ``prompt`` with a row for each of ``uniforms`` [rows, steps], each
        at most ``limit`` new tokens (None: the call's); its rows wait for free slots behind the
        others'. Its index (after every group before it)."""
        m, steps = uniforms.shape
        limit = self.limit if limit is None else limit
        if (
            m == 0
            or steps != self.limit
            or not 1 <= limit <= steps
            or len(prompt) + limit > self.cache.length
        ):
            raise ValueError(f"a group of {m} rows, {len(prompt)} prompt tokens and {limit} new ones cannot"
                             f" join a call of {self.limit} new tokens in {self.cache.length} positions")  # fmt: skip
        n, g = self.n, len(self.sizes)
        spare = torch.tensor([n + m], device=self.cache.device)
        self.uniforms = torch.cat([self.uniforms[:n], uniforms.to(self.uniforms), self.uniforms[n:]])
        self.out_tokens = torch.cat([self.out_tokens[:n], self.out_tokens.new_full((m + 1, steps + 1), -1)])
        self.out_logprobs = torch.cat([self.out_logprobs[:n], self.out_logprobs.new_zeros(m + 1, steps + 1)])
        self.row = torch.where(self.row == n, spare, self.row)
        self.n = n + m
        self.prompts = [*self.prompts, prompt]
        self.sizes.append(m)
        self.group_of += [g] * m
        self.row_limit += [limit] * m
        self.rows_of.append(list(range(n, n + m)))
        self.left.append(m)
        self.ended_step.append(0)
        self.counts += [0] * m
        self.open.add(g)
        self.pending.extend(range(n, n + m))
        return g

    def _may_run(self) -> bool:
        """Whether some row held may still sample, as the host counts: a row samples its first token
        when admitted and one a step after, at most its limit in all."""
        return any(
            self.clock - start < self.row_limit[self.held[s]] - 1 for s, start in self.admitted.items()
        )

    def _admit(self) -> None:
        """Pending rows into the free slots, in order: their groups' prompts prefilled together (once
        a group), each row's first token sampled from its prompt's last logits."""
        free = self.cache.slots - self.cache.held
        if not self.pending or free == 0:
            return
        rows = [self.pending.popleft() for _ in range(min(free, len(self.pending)))]
        admitted = sorted({self.group_of[r] for r in rows})
        fresh = [g for g in admitted if g not in self.prefilled]
        if fresh:
            self.prefilled.update(zip(fresh, self.prefill([self.prompts[g] for g in fresh]), strict=True))
        slots = self.cache.take(len(rows))
        device = self.cache.device
        for g in admitted:
            mine = [s for s, r in zip(slots, rows, strict=True) if self.group_of[r] == g]
            kv, _ = self.prefilled[g]
            self.cache.write_prompt(torch.tensor(mine, device=device), kv._keys, kv._values)
        logits = torch.cat([self.prefilled[self.group_of[r]][1] for r in rows])
        for r in rows:  # a group's prefill is kept until its last row is in
            g = self.group_of[r]
            if r == self.rows_of[g][-1]:
                self.prefilled.pop(g, None)
        row_t = torch.tensor(rows, device=device)
        slot_t = torch.tensor(slots, device=device)
        lengths = torch.tensor([len(self.prompts[self.group_of[r]]) for r in rows], device=device)
        token, logprob = sample(logits, self.uniforms[row_t, 0], self.temperature, self.top_p)
        self.out_tokens[row_t, 0] = token
        self.out_logprobs[row_t, 0] = logprob
        cap = torch.tensor([self.row_limit[r] for r in rows], device=device)
        ended = (token == self.eos) | (cap <= 1)
        self.cap[slot_t] = cap
        self.token[slot_t] = token
        self.position[slot_t] = lengths
        self.count[slot_t] = 1
        self.alive[slot_t] = ~ended
        self.row[slot_t] = row_t
        self.ended_at[slot_t] = self.clock
        for s, r in zip(slots, rows, strict=True):
            self.held[s] = r
            self.admitted[s] = self.clock
            self.reach[s] = len(self.prompts[self.group_of[r]]) - self.clock
        self.stats.admissions.append(len(rows))

    def _step(self) -> None:
        """One token for each row held, computed over the slots' bucket: the slots from the highest
        held on only pad its products (they attend nothing and sample nothing)."""
        h = self.cache.highest()
        b = self.bucket(h)
        width = width_bucket(max(self.reach.values()) + self.clock + 1, self.cache.length)
        write_at = torch.where(self.alive[:b], self.position[:b], self.cache.spare)
        logits = self.step(self.token[:b], self.position[:b], write_at, width, h)[:h]
        alive, position = self.alive[:h], self.position[:h]
        count, row = self.count[:h], self.row[:h]
        token, logprob = sample(
            logits, self.uniforms[row, count.clamp(max=self.limit - 1)], self.temperature, self.top_p
        )
        out_row = torch.where(alive, row, self.n)
        out_col = torch.where(alive, count, self.limit)
        self.out_tokens[out_row, out_col] = token
        self.out_logprobs[out_row, out_col] = logprob
        count += alive
        position += alive
        ends = alive & ((token == self.eos) | (count >= self.cap[:h]))
        self.clock += 1
        self.ended_at[:h] = torch.where(ends, self.clock, self.ended_at[:h])
        self.token[:h] = torch.where(alive, token, self.token[:h])
        alive &= ~ends
        self.stats.steps.append(b)
        self.stats.live.append(len(self.held))
        self.stats.attending.append(h)

    def _retire(self, told: Told | None) -> None:
        """Free the slots of rows that have ended; tell each group whose rows have all ended, in the
        order they ended (ties in index order)."""
        if not self.held:
            return
        slots = list(self.held)
        index = torch.tensor(slots, device=self.cache.device)
        alive, count, ended_at = torch.stack(
            [self.alive[index].long(), self.count[index], self.ended_at[index]]
        ).tolist()
        finished: list[int] = []
        for s, a, c, at in zip(slots, alive, count, ended_at, strict=True):
            if a:
                continue
            r = self.held.pop(s)
            del self.admitted[s], self.reach[s]
            self.cache.free([s])
            self.counts[r] = c
            g = self.group_of[r]
            self.left[g] -= 1
            self.ended_step[g] = max(self.ended_step[g], at)
            if self.left[g] == 0 and g in self.open:
                finished.append(g)
        for g in sorted(finished, key=lambda g: (self.ended_step[g], g)):
            self.open.discard(g)
            self.done[g] = self._rows(g)
            if told is not None:
                told(g, self.done[g])

    def _rows(self, g: int) -> list[tuple[list[int], list[float], bool]]:
        rows = self.rows_of[g]
        width = max(self.counts[r] for r in rows)
        tokens = self.out_tokens[rows[0] : rows[-1] + 1, :width].tolist()
        logprobs = self.out_logprobs[rows[0] : rows[-1] + 1, :width].tolist()
        out = []
        for r, ids, lps in zip(rows, tokens, logprobs, strict=True):
            n = self.counts[r]
            out.append((ids[:n], lps[:n], n > 0 and ids[n - 1] == self.eos))
        return out

    def _holes(self) -> bool:
        """Whether moving the highest row down would make the steps smaller."""
        held, highest = len(self.held), self.cache.highest()
        return self.bucket(held) < self.bucket(highest) or (not self.bucketed and held < highest)

    def _stop(self, groups: Collection[int]) -> None:
        """Drop the open groups among ``groups``: their rows leave their slots (or the queue) now."""
        fresh = [g for g in groups if g in self.open]
        if not fresh:
            return
        self.open.difference_update(fresh)
        gone = {r for g in fresh for r in self.rows_of[g]}
        self.pending = deque(r for r in self.pending if r not in gone)
        for g in fresh:
            self.prefilled.pop(g, None)
        slots = [s for s, r in self.held.items() if r in gone]
        if slots:
            self.alive[torch.tensor(slots, device=self.cache.device)] = False
            for s in slots:
                del self.held[s], self.admitted[s], self.reach[s]
            self.cache.free(slots)

    def _compact(self) -> None:
        """Move the highest rows into the lowest free slots while that makes the step's bucket
        smaller, or, with exact rows, while a slot below the highest held is free (a step attends
        and samples every slot below it: a free one costs a row's attention a step, a move one row's
        cache once): a few rows' caches copied, never the others'."""
        while self.held and self._holes():
            source, target = self.cache.highest() - 1, self.cache.lowest_free()
            width = width_bucket(self.reach[source] + self.clock + 1, self.cache.length)
            self.cache.move(source, target, width)
            for state in (
                self.token,
                self.position,
                self.count,
                self.alive,
                self.row,
                self.ended_at,
                self.cap,
            ):
                state[target] = state[source]
            self.alive[source] = False
            self.held[target] = self.held.pop(source)
            self.admitted[target] = self.admitted.pop(source)
            self.reach[target] = self.reach.pop(source)
