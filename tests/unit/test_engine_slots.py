"""The engine's slots, buckets, decode step and loop: the step against the full forward, rows admitted
mid-decode, reads back every few steps, the compiled step against the eager one, a compile that fails,
and a cache that does not fit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import structlog
import torch
from torch import Tensor

from cadence.model import compiled_step
from cadence.model import engine as engine_module
from cadence.model.config import ModelConfig
from cadence.model.decode_step import decode_step, project, weights_first_here
from cadence.model.engine import Completion, SamplingParams, TorchEngine, sample_seed
from cadence.model.slots import SlotCache, cache_bytes, row_bucket, width_bucket
from cadence.model.transformer import init_model

CFG = ModelConfig(
    vocab_size=19, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
)
EOS = 2
PROMPTS = [[1, 5, 9, 4, 7], [1, 8], [3, 3, 6, 1, 5, 9, 12, 4], [6, 3, 8], [9, 9, 4]]


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def _groups(samples: int = 2) -> list[tuple[list[int], list[int]]]:
    return [(p, [sample_seed(0, 1, i, j) for j in range(samples)]) for i, p in enumerate(PROMPTS)]


def _same(got: list[list[Completion]], want: list[list[Completion]], tol: float = 1e-5) -> None:
    assert [[c.tokens for c in g] for g in got] == [[c.tokens for c in g] for g in want]
    assert [[c.finished for c in g] for g in got] == [[c.finished for c in g] for g in want]
    for ours, theirs in zip(got, want, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=tol)


def test_buckets_are_few_and_cover_every_count() -> None:
    assert [row_bucket(n, 64) for n in (1, 2, 3, 5, 8, 9, 16, 17, 33, 64)] == [
        2,
        2,
        4,
        8,
        8,
        16,
        16,
        32,
        48,
        64,
    ]
    assert row_bucket(40, 20) == 20 and row_bucket(1, 1) == 1  # never more than the slots
    assert len({row_bucket(n, 512) for n in range(1, 513)}) == 3 + 512 // 16
    assert [width_bucket(p, 256) for p in (1, 64, 65, 250)] == [64, 64, 128, 256]


def test_slots_are_handed_out_lowest_first_and_a_move_copies_one_row() -> None:
    cache = SlotCache(CFG, slots=4, length=8, dtype=torch.float32, device=torch.device("cpu"))
    assert cache.take(3) == [0, 1, 2] and cache.highest() == 3
    for k in cache.keys:
        k[2] = 7.0
    cache.free([0])
    assert cache.lowest_free() == 0
    cache.move(2, 0, width=8)
    assert cache.highest() == 2 and cache.held == 2
    assert all(bool((k[0, :, :8] == 7.0).all()) for k in cache.keys)
    assert cache.take(2) == [2, 3]
    with pytest.raises(ValueError, match="1 slots asked, 0 free"):
        cache.take(1)


def test_a_decode_step_gives_each_slot_the_full_forwards_logits_at_its_own_position() -> None:
    """Rows at different positions, one of them padded (writing to the spare position): each row's
    logits are the full forward's at its position, and the padded row changes nothing read."""
    model = init_model(CFG, seed=3).eval()
    prompts = [[1, 5, 9, 4, 7], [3, 8], [6, 3, 8, 1]]
    cache = SlotCache(CFG, slots=4, length=16, dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        for slot, prompt in enumerate(prompts):  # each prompt's keys and values but its last token's
            ids = torch.tensor([prompt[:-1]])
            for p in range(len(prompt) - 1):
                decode_step(
                    model, [k[slot : slot + 1] for k in cache.keys], [v[slot : slot + 1] for v in cache.values],
                    ids[:, p], torch.tensor([p]), torch.tensor([p]), 16,
                )  # fmt: skip
        tokens = torch.tensor([p[-1] for p in prompts] + [0])
        positions = torch.tensor([len(p) - 1 for p in prompts] + [3])
        write_at = torch.cat([positions[:3], torch.tensor([cache.spare])])
        logits = decode_step(model, cache.keys, cache.values, tokens, positions, write_at, 16)
        first = decode_step(model, cache.keys, cache.values, tokens, positions, write_at, 16, True)
        torch.testing.assert_close(first, logits, atol=1e-5, rtol=1e-5)  # the products as W·xᵀ
        for by_rows in (
            False,
            True,
        ):  # the padded row left out of the attention: the others' bits as they were
            attending = decode_step(
                model, cache.keys, cache.values, tokens, positions, write_at, 16, by_rows=by_rows
            )
            alone = decode_step(
                model, cache.keys, cache.values, tokens, positions, write_at, 16, by_rows=by_rows, live=3
            )
            if by_rows:
                assert torch.equal(alone[:3], attending[:3])
            torch.testing.assert_close(alone[:3], attending[:3], atol=1e-6, rtol=1e-6)
        for row, prompt in enumerate(prompts):
            full = model(torch.tensor([prompt]))[0, -1]
            torch.testing.assert_close(logits[row], full, atol=1e-5, rtol=1e-5)
        assert all(
            bool((k[3, :, : cache.spare] == 0).all()) for k in cache.keys
        )  # the padded row wrote nowhere read


@pytest.mark.parametrize("bias", [False, True])
def test_a_projection_as_w_times_x_equals_the_modules_own(bias: bool) -> None:
    """The step's float32 products on the CPU (W·xᵀ) equal ``nn.Linear``'s (x·Wᵀ) to float rounding, in
    the layout a caller reads; a module with a hook, in bfloat16 or with one thread is the module's own
    call."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(7, 1, 48)
    with torch.no_grad():
        got = project(linear, x)
        assert got.shape == (7, 1, 80) and not got.is_contiguous()  # W·xᵀ read through its transpose
        torch.testing.assert_close(got, linear(x), atol=1e-5, rtol=1e-5)
        seen: list[Tensor] = []
        handle = linear.register_forward_hook(lambda _m, _i, out: seen.append(out))
        assert torch.equal(project(linear, x), linear(x)) and len(seen) == 2
        handle.remove()
        half = linear.to(torch.bfloat16)
        assert torch.equal(project(half, x.bfloat16()), half(x.bfloat16()))
        assert torch.equal(project(linear.float(), x, weights_first=False), linear.float()(x))
    threads = torch.get_num_threads()
    cpu = torch.device("cpu")
    try:
        torch.set_num_threads(1)  # one thread: x·Wᵀ is the faster there
        assert not weights_first_here(cpu, "AVX2")
        torch.set_num_threads(2)
        assert weights_first_here(cpu, "AVX2") and not weights_first_here(torch.device("meta"), "AVX2")
        assert not weights_first_here(cpu, "AVX512")  # an Intel Xeon's MKL: x·Wᵀ the faster
        here = torch.backends.cpu.get_cpu_capability()
        assert weights_first_here(cpu) == (here == "AVX2")
    finally:
        torch.set_num_threads(threads)


def test_rows_admitted_as_slots_free_give_every_sample_unchanged() -> None:
    """Three slots for ten rows: rows join the batch between two steps as others end, and every
    sample is the one a batch of all of them gives."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    wide = TorchEngine(init_model(CFG, seed=6), eos_id=EOS)
    narrow = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=3)
    told: list[int] = []
    got = narrow.generate_many(_groups(), params, ended=lambda i, _: told.append(i))
    _same(got, wide.generate_many(_groups(), params))
    assert sorted(told) == list(range(len(PROMPTS)))
    assert len(narrow.last_call.admissions) > 1 and sum(narrow.last_call.admissions) == 10
    assert max(narrow.last_call.live) <= 3


@pytest.mark.parametrize("readback", [2, 5])
def test_reading_back_every_few_steps_changes_no_sample_and_no_order(readback: int) -> None:
    params = SamplingParams(max_new_tokens=14, temperature=1.0)
    every = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=4)
    few = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=4, readback=readback)
    told_every: list[int] = []
    told_few: list[int] = []
    want = every.generate_many(_groups(3), params, ended=lambda i, _: told_every.append(i))
    got = few.generate_many(_groups(3), params, ended=lambda i, _: told_few.append(i))
    _same(got, want)
    assert sorted(told_few) == sorted(told_every)


@pytest.mark.parametrize(
    ("cfg", "dtype", "weights_first"),
    [
        (CFG, torch.float32, True),
        (CFG, torch.float32, False),
        (dataclasses.replace(CFG, num_layers=3, family="qwen3"), torch.bfloat16, False),
    ],
    ids=["float32-w-x", "float32-x-w", "bfloat16-qk-norm"],
)
def test_the_compiled_step_samples_what_the_eager_one_does(
    cfg: ModelConfig, dtype: torch.dtype, weights_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit: the same tokens and the same log-probs, the products as W·xᵀ or as x·Wᵀ
    (whichever this CPU takes, both asked for here). The norms, softmax and rotary cos/sin stay
    ATen's inside the compiled step (exact_ops), its products get the eager step's operand layout,
    16-bit values are rounded where eager rounds them, and one layer's compiled region serves every
    layer."""
    for module in (compiled_step, engine_module):
        monkeypatch.setattr(
            module, "weights_first_here", lambda device: weights_first and device.type == "cpu"
        )
    params = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.95)
    eager = TorchEngine(init_model(cfg, seed=8), eos_id=EOS, rows=2, dtype=dtype)
    compiled = TorchEngine(init_model(cfg, seed=8), eos_id=EOS, rows=2, dtype=dtype, compiled=True)
    assert compiled.warm_up(length=64) > 0.0 and compiled.runner.compiled
    _same(compiled.generate_many(_groups(), params), eager.generate_many(_groups(), params), tol=0.0)
    assert compiled.runner.compiled  # no fallback was taken


def test_the_compiled_step_computes_the_eager_steps_bits_at_every_width() -> None:
    """Rows at positions up to 190 of a cache of 256, stepped at widths of one to four chunks of the
    values' sum (`exact_ops.values_by_chunks`, a custom op inside the trace): the compiled step's
    logits are the eager step's bit for bit at each width, from one compile."""
    model = init_model(CFG, seed=4).eval()
    runner = compiled_step.StepRunner(model, compiled=True)
    cache = SlotCache(CFG, slots=4, length=256, dtype=torch.float32, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    for k in (*cache.keys, *cache.values):
        k.copy_(torch.randn(k.shape, generator=g))
    tokens = torch.tensor([3, 7, 11, 5])
    spare = torch.full((4,), cache.spare)
    with torch.no_grad():
        for width in (64, 128, 192, 256):
            positions = torch.tensor([width - 1, width - 30, 10, width // 2])
            eager = decode_step(
                model, cache.keys, cache.values, tokens, positions, spare, width, by_rows=True
            )
            compiled = runner(cache.keys, cache.values, tokens, positions, spare, width)
            assert torch.equal(compiled, eager), width
    assert runner.compiled  # no fallback was taken


def test_a_compile_that_fails_falls_back_to_eager_with_one_line() -> None:
    def broken(fn: Callable[..., Tensor], **_: Any) -> Callable[..., Tensor]:
        def fails(*args: Any) -> Tensor:
            raise RuntimeError("no compiler here")

        return fails

    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    eager = TorchEngine(init_model(CFG, seed=8), eos_id=EOS)
    failing = TorchEngine(init_model(CFG, seed=8), eos_id=EOS, compiled=True, compiler=broken)
    with structlog.testing.capture_logs() as logs:
        got = failing.generate_many(_groups(), params)
    _same(got, eager.generate_many(_groups(), params))
    assert not failing.runner.compiled
    assert [e["event"] for e in logs].count("engine_compile_failed") == 1


def test_a_cache_that_does_not_fit_is_refused_naming_the_setting() -> None:
    engine = TorchEngine(init_model(CFG, seed=8), eos_id=EOS, rows=1 << 40)
    with pytest.raises(ValueError, match="rollout.engine_rows"):
        engine.generate([1, 5], [1], SamplingParams(max_new_tokens=4))


def test_a_cache_hinted_longer_than_fits_is_made_as_long_as_the_call_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Room for the rows of this call (256 positions) and not for the hinted 512 (an episode's later
    turns): the call goes on with the cache it needs, and says so; past that, the setting is named."""
    import cadence.model.engine as engine_module

    cfg = dataclasses.replace(CFG, max_position=1024)
    engine = TorchEngine(init_model(cfg, seed=8), eos_id=EOS, rows=4)
    monkeypatch.setattr(engine_module, "device_room", lambda device: cache_bytes(cfg, 4, 256, torch.float32))
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    with structlog.testing.capture_logs() as logs:
        got = engine.generate_many([([1, 5], [1])], params, positions=512)
    assert [len(c.tokens) for c in got[0]] == [len(engine.generate([1, 5], [1], params)[0].tokens)]
    assert engine._cache is not None and engine._cache.length == 256
    assert [e["positions"] for e in logs if e["event"] == "engine_cache_hint_refused"] == [512]
    with pytest.raises(ValueError, match="rollout.engine_rows"):
        engine.generate_many([([1] * 300, [1])], params)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here (scripts/gpu_check.sh runs it)"
)
@pytest.mark.parametrize("compiled", [False, True])
def test_on_a_gpu_the_engine_samples_what_it_samples_on_the_cpu(compiled: bool) -> None:
    """The slots, the step (eager, or compiled with CUDA graphs replayed) and the sampling on the
    device: the CPU's tokens, log-probs within what the device's kernels round otherwise."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    here = TorchEngine(init_model(CFG, seed=8), eos_id=EOS, device="cuda", rows=4, compiled=compiled)
    here.warm_up(length=64)
    cpu = TorchEngine(init_model(CFG, seed=8), eos_id=EOS, rows=4)
    _same(here.generate_many(_groups(), params), cpu.generate_many(_groups(), params), tol=1e-4)
    assert here.runner.compiled == compiled


def test_a_group_stopped_with_rows_still_waiting_for_a_slot_leaves_nothing_behind() -> None:
    """One slot, groups of three: a stop names the group decoding and one not yet admitted; the
    others' samples are the ones a wide batch gives, the stopped groups get []."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    wide = TorchEngine(init_model(CFG, seed=6), eos_id=EOS)
    one = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=1)
    polls = [0]

    def stopped() -> set[int]:
        polls[0] += 1
        return {0, 3} if polls[0] >= 3 else set()

    told: list[int] = []
    got = one.generate_many(_groups(3), params, ended=lambda i, _: told.append(i), stopped=stopped)
    want = wide.generate_many(_groups(3), params)
    assert got[0] == [] and got[3] == [] and 0 not in told and 3 not in told
    _same([got[i] for i in (1, 2, 4)], [want[i] for i in (1, 2, 4)])
    assert sorted(told) == [1, 2, 4] and max(one.last_call.live) == 1


def test_groups_that_join_a_running_call_give_the_samples_they_give_alone() -> None:
    """Two groups start the call; the other three join it while it decodes, one at each of three
    readbacks (one too long for the call's positions waits): every sample is the one a batch of all
    five gives, every group is told once, the joined ones at the indices after the call's own."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    wide = TorchEngine(init_model(CFG, seed=6), eos_id=EOS)
    narrow = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=4)
    groups = _groups(3)
    first, later = groups[:2], [groups[3], groups[2], groups[4]]  # the 8-token prompt second
    asked: list[int] = []

    def joining(room: int) -> list[tuple[list[int], list[int]]]:
        asked.append(room)
        if len(asked) % 3 or not later or len(later[0][0]) > room:
            return []
        return [later.pop(0)]

    told: list[int] = []
    got = narrow.generate_many(first, params, ended=lambda i, _: told.append(i), joining=joining)
    want = wide.generate_many(groups, params)
    assert len(got) == 5 and sorted(told) == [0, 1, 2, 3, 4]
    _same(got, [want[0], want[1], want[3], want[2], want[4]])
    assert max(narrow.last_call.live) <= 4 and sum(narrow.last_call.admissions) == 15


def test_a_group_of_its_own_token_limit_samples_what_a_call_of_that_limit_does() -> None:
    """Groups of limits 1, 3, 7 and 12 in one call of 12 new tokens (the episodes' turns of different
    room), rows admitted as others end: each group's samples are, bit for bit, what a call of its own
    limit gives, and what a call of 12 gives cut at its limit where that one did not end before."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    groups, limits = _groups(2)[:4], [3, 12, 1, 7]
    engine = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=3)
    got = engine.generate_many(groups, params, limits=limits)
    assert sum(engine.last_call.admissions) == 8
    longest = engine.generate_many(groups, params)
    for group, limit, mine, whole in zip(groups, limits, got, longest, strict=True):
        _same([mine], engine.generate_many([group], SamplingParams(limit, temperature=1.0)), tol=0.0)
        assert all(len(c.tokens) <= limit for c in mine)
        for cut, full in zip(mine, whole, strict=True):
            assert cut.tokens == full.tokens[:limit] and cut.logprobs == full.logprobs[:limit]
    with pytest.raises(ValueError, match=r"token limits \[3, 13\] for 2 groups of at most 12"):
        engine.generate_many(groups[:2], params, limits=[3, 13])


def test_a_group_that_cannot_join_is_refused_with_the_reason() -> None:
    """A group of no seeds (nothing to decode) may not join; nor a prompt the model cannot hold."""
    engine = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=2)
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="a group of 0 rows, 1 prompt tokens and 4 new ones cannot join"):
        engine.generate_many(_groups()[:1], params, joining=lambda room: [([1], [])])
    with pytest.raises(ValueError, match="exceeds max_position"):
        engine.generate_many(_groups()[:1], params, joining=lambda room: [([1] * (room + 1), [5])])


def test_a_step_padded_to_the_least_rows_attends_and_samples_only_the_rows_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eager, with fewer rows held than a product's least (8 here): the step computes 8 rows, but
    only the rows held attend and sample, each freed slot below the highest filled by moving the
    highest row down; the same samples bit for bit as steps of the rows held alone."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    padded = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=16)
    monkeypatch.setattr(padded, "_least_rows", lambda weights_first: 8)
    held = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=16)
    _same(padded.generate_many(_groups(3), params), held.generate_many(_groups(3), params), tol=0.0)
    stats = padded.last_call
    assert min(stats.live) < 8 < max(stats.live)  # steps of padding and steps without
    assert stats.steps == [max(n, 8) for n in stats.live]
    assert stats.attending == stats.live


def test_steps_of_buckets_and_steps_of_the_rows_held_sample_alike() -> None:
    """Eager on the CPU a step computes exactly the rows held (at least those from which each comes
    out as alone: invariance.py); with buckets (a compiled step's, a GPU's) it computes 2, 4, 8 or a
    multiple of 16 of them (at least as many), the rest padding: the same samples, bit for bit."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    exact = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=16)
    bucketed = TorchEngine(init_model(CFG, seed=6), eos_id=EOS, rows=16, buckets=True)
    assert not exact.buckets and bucketed.buckets
    _same(exact.generate_many(_groups(3), params), bucketed.generate_many(_groups(3), params), tol=0.0)
    least = exact._least_rows(weights_first_here(exact.device))
    assert exact.last_call.steps == [min(max(n, least), 16) for n in exact.last_call.live]
    assert all(
        b in (2, 4, 8, 16) and b >= min(max(live, least), 16)
        for b, live in zip(bucketed.last_call.steps, bucketed.last_call.live, strict=True)
    )
    assert sum(bucketed.last_call.steps) > sum(exact.last_call.steps)
