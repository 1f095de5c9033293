"""The built-in engine on a tiny model on CPU: seeding, greedy, nucleus, eos, weight loading, groups handed
back as they end and stopped groups leaving the batch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cadence.model import prefill as prefill_module
from cadence.model.checkpoint import state_dict_from_bytes, state_dict_to_bytes, tensors_to_bytes
from cadence.model.config import ModelConfig
from cadence.model.decode_step import weights_first_here
from cadence.model.engine import Completion, SamplingParams, TorchEngine, sample_seed
from cadence.model.hf_state import hf_state_dict, share_hf_state_dict
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.transformer import init_model
from cadence.transport.buffers import BufferPool

CFG = ModelConfig(
    vocab_size=19, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
)
EOS = 2
PROMPT = [1, 5, 9, 4, 7]


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


def _engine(seed: int = 0) -> TorchEngine:
    return TorchEngine(init_model(CFG, seed=seed), eos_id=EOS)


def _greedy_reference(engine: TorchEngine, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(engine.model(torch.tensor([ids]))[0, -1].argmax()))
        if ids[-1] == EOS:
            break
    return ids[len(prompt) :]


def test_sample_seed_is_stable_and_distinct() -> None:
    assert sample_seed(1, 2, 3, 4) == sample_seed(1, 2, 3, 4)
    seeds = {sample_seed(1, 2, 3, i) for i in range(100)} | {sample_seed(1, 3, 2, 0), sample_seed(2, 2, 3, 0)}
    assert len(seeds) == 102
    assert all(0 <= s < 2**63 for s in seeds)


def test_sample_depends_only_on_its_own_seed() -> None:
    engine = _engine()
    params = SamplingParams(max_new_tokens=40, temperature=1.3)
    batch = engine.generate(PROMPT, [11, 22, 33], params)
    alone = engine.generate(PROMPT, [22], params)[0]
    assert batch[1].tokens == alone.tokens
    assert batch[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert batch[0].tokens != batch[1].tokens  # different seeds, different samples


def test_a_calls_overrides_replace_only_what_they_name() -> None:
    params = SamplingParams(max_new_tokens=40, temperature=1.3, top_p=0.9)
    assert params.overridden() is params
    assert params.overridden(temperature=0.0) == SamplingParams(max_new_tokens=40, temperature=0.0, top_p=0.9)
    assert params.overridden(max_new_tokens=7) == SamplingParams(max_new_tokens=7, temperature=1.3, top_p=0.9)
    assert params.overridden(0.5, 3) == SamplingParams(max_new_tokens=3, temperature=0.5, top_p=0.9)
    with pytest.raises(ValueError, match="max_new_tokens"):
        params.overridden(max_new_tokens=0)


def test_greedy_equals_argmax_of_full_forward() -> None:
    engine = _engine(seed=1)
    out = engine.generate(PROMPT, [1, 2], SamplingParams(max_new_tokens=20, temperature=0.0))
    reference = _greedy_reference(engine, PROMPT, 20)
    assert out[0].tokens == reference and out[1].tokens == reference
    logits = engine.model(torch.tensor([PROMPT + reference]))[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(reference)[:, None]).squeeze(1)
    assert out[0].logprobs == pytest.approx(expected.tolist(), abs=1e-5)


def test_tiny_top_p_is_greedy() -> None:
    engine = _engine(seed=2)
    greedy = engine.generate(PROMPT, [5], SamplingParams(max_new_tokens=20, temperature=0.0))[0]
    nucleus = engine.generate(
        PROMPT, [5, 6, 7], SamplingParams(max_new_tokens=20, temperature=1.0, top_p=1e-6)
    )
    assert all(c.tokens == greedy.tokens for c in nucleus)


@pytest.mark.parametrize(("temperature", "divisor"), [(0.5, 0.5), (1.0, 1.0), (0.0, 1.0)])
def test_logprobs_are_of_the_tempered_distribution_before_top_p(temperature: float, divisor: float) -> None:
    """log softmax(logits / T) of each sampled token, top-p not renormalised; greedy (T = 0) at T = 1."""
    engine = _engine(seed=3)
    params = SamplingParams(max_new_tokens=6, temperature=temperature, top_p=0.8)
    out = engine.generate(PROMPT, [9], params)[0]
    logits = engine.model(torch.tensor([PROMPT + out.tokens]))[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits / divisor, -1).gather(1, torch.tensor(out.tokens)[:, None]).squeeze(1)
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-5)
    untempered = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.tokens)[:, None]).squeeze(1)
    if divisor != 1.0:
        assert max(abs(a - b) for a, b in zip(out.logprobs, untempered.tolist(), strict=True)) > 1e-3


def test_eos_stops_a_sample() -> None:
    engine = _engine(seed=4)
    steps: list[int] = []

    def biased(_m: torch.nn.Module, inputs: object, out: torch.Tensor) -> torch.Tensor:
        if out.dim() != 3 or out.shape[1] != 1:
            return out  # the prefill's head
        out = out.clone()  # a decode step's [slots, 1, V]
        out[:, 0, EOS] -= 50.0  # every sample all but surely runs on to the end
        if not steps:  # but the one in slot 0 at the first decode step, row 0, ends on eos there
            out[0, 0, EOS] += 100.0  # (row 1 is moved down into its slot after)
        steps.append(out.shape[0])
        return out

    engine.model.lm_head.register_forward_hook(biased)
    short, long = engine.generate(PROMPT, [3, 4], SamplingParams(max_new_tokens=12))
    assert short.finished and short.tokens[-1] == EOS and len(short.tokens) <= 2
    assert len(short.logprobs) == len(short.tokens)
    assert not long.finished and len(long.tokens) == len(long.logprobs) == 12 and EOS not in long.tokens
    # the row that ended early does not change the other: beside another early one, the same sample
    steps.clear()
    _, again = engine.generate(PROMPT, [5, 4], SamplingParams(max_new_tokens=12))
    assert again.tokens == long.tokens and again.logprobs == pytest.approx(long.logprobs, abs=1e-5)


def test_generation_respects_max_position() -> None:
    engine = _engine()
    with pytest.raises(ValueError, match="max_position"):
        engine.generate(PROMPT, [1], SamplingParams(max_new_tokens=CFG.max_position))
    out = engine.generate(PROMPT, [1], SamplingParams(max_new_tokens=CFG.max_position - len(PROMPT)))[0]
    assert out.finished or len(out.tokens) == CFG.max_position - len(PROMPT)


def test_state_bytes_round_trip_through_engine() -> None:
    source, target = _engine(seed=10), _engine(seed=11)
    params = SamplingParams(max_new_tokens=30, temperature=0.9, top_p=0.95)
    seeds = [sample_seed(0, 1, 2, i) for i in range(4)]
    before = target.generate(PROMPT, seeds, params)
    target.load_state_dict(state_dict_from_bytes(state_dict_to_bytes(source.model)))
    after = target.generate(PROMPT, seeds, params)
    assert after == source.generate(PROMPT, seeds, params)
    assert after != before
    assert target.model.lm_head.weight is target.model.model.embed_tokens.weight
    with pytest.raises(RuntimeError, match="Missing"):
        target.load_state_dict({"model.norm.weight": torch.ones(CFG.hidden_size)})


def test_several_prompts_decoded_together_give_each_prompt_its_own_samples() -> None:
    engine = _engine(seed=2)
    params = SamplingParams(max_new_tokens=12, temperature=1.1)
    prompts = [PROMPT, [1, 8], [3, 3, 6, 1, 5, 9, 12, 4], PROMPT[:3]]  # lengths 5, 2, 8, 3
    seeds = [[1, 2, 3], [4], [5, 6], []]
    together = engine.generate_many(list(zip(prompts, seeds, strict=True)), params)
    assert [len(g) for g in together] == [3, 1, 2, 0]
    for prompt, group_seeds, batch in zip(prompts, seeds, together, strict=True):
        alone = engine.generate(prompt, group_seeds, params)
        assert [c.tokens for c in batch] == [c.tokens for c in alone]
        for a, b in zip(batch, alone, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            assert a.finished == b.finished


def test_rows_of_a_shorter_prompt_see_only_their_own_prompt() -> None:
    engine = _engine(seed=3)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    short, long = [4, 7], [9, 9, 9, 9, 9, 9, 9, 9, 9]
    together = engine.generate_many([(short, [0]), (long, [0])], greedy)
    assert together[0][0].tokens == _greedy_reference(engine, short, 10)
    assert together[1][0].tokens == _greedy_reference(engine, long, 10)


def test_rows_that_ended_leave_the_batch_without_changing_any_sample() -> None:
    engine = _engine(seed=5)
    params = SamplingParams(max_new_tokens=40, temperature=1.5)
    seeds = list(range(100, 112))
    batch = engine.generate(PROMPT, seeds, params)
    lengths = sorted(len(c.tokens) for c in batch)
    assert lengths[0] < 10 and lengths[-1] > 20  # rows ended early while others went on: they left
    for seed, sample in zip(seeds, batch, strict=True):
        alone = engine.generate(PROMPT, [seed], params)[0]
        assert sample.tokens == alone.tokens and sample.finished == alone.finished
        assert sample.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


TRUNK = [1, 5, 9, 4, 7, 3, 3, 8, 6]  # what a chat template puts before every prompt's own text


def test_prompts_that_begin_with_the_trunk_generate_as_when_computed_whole() -> None:
    whole = _engine(seed=3)
    trunked = TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=TRUNK)
    prompts = [TRUNK + [10, 11], TRUNK + [12], [1, 5, 9, 13, 14], TRUNK]  # two own, one other, the trunk
    groups = [(p, [sample_seed(0, 0, i, j) for j in range(3)]) for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    for expected, got in zip(
        whole.generate_many(groups, params), trunked.generate_many(groups, params), strict=True
    ):
        assert [c.tokens for c in got] == [c.tokens for c in expected]
        for a, b in zip(got, expected, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert trunked.prefill.trunk_kv is not None and trunked.prefill.trunk_kv.length == len(TRUNK)


def test_a_shared_load_computes_with_the_buffers_bytes_and_keeps_the_pool_off_them() -> None:
    source, target, copied = _engine(seed=10), _engine(seed=11), _engine(seed=11)
    pool = BufferPool(keep=2)
    data = tensors_to_bytes(hf_state_dict(source.model), pool.take)
    rollout = TorchRolloutEngine(target, SamplingParams(max_new_tokens=12, temperature=0.9))
    own = [id(p) for p in target.model.parameters()]
    rollout.load(data)
    assert [id(p) for p in target.model.parameters()] == own  # the same parameters, their data the bytes
    copied.load_state_dict(state_dict_from_bytes(data))
    buffer = torch.frombuffer(data, dtype=torch.uint8)
    low, high = buffer.data_ptr(), buffer.data_ptr() + len(data)
    del buffer
    # no weight of its own: each is the pulled bytes themselves
    assert all(low <= p.data_ptr() < high for p in target.model.parameters())
    assert not low <= copied.model.model.norm.weight.data_ptr() < high
    assert target.model.lm_head.weight is target.model.model.embed_tokens.weight
    seeds = [sample_seed(0, 1, 2, i) for i in range(4)]
    assert rollout.generate(PROMPT, seeds) == copied.generate(PROMPT, seeds, rollout.params)
    nbytes, given = len(data), id(data)
    pool.give(data)
    del data  # the pool's and the engine's references are left
    assert id(pool.take(nbytes)) != given  # the engine computes with it: not handed out
    rollout.load(tensors_to_bytes(hf_state_dict(_engine(seed=12).model)))
    assert id(pool.take(nbytes)) == given  # the next version loaded: free again


def test_a_shared_state_of_other_names_or_shapes_is_refused_naming_the_tensor() -> None:
    target = _engine(seed=11)
    state = hf_state_dict(_engine(seed=10).model)
    wide = dict(state, **{"model.norm.weight": torch.ones(CFG.hidden_size + 1)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        share_hf_state_dict(target.model, wide)
    with pytest.raises(ValueError, match="missing.*model.norm.weight"):
        share_hf_state_dict(target.model, {k: v for k, v in state.items() if k != "model.norm.weight"})
    assert torch.equal(
        target.model.model.norm.weight, hf_state_dict(_engine(seed=11).model)["model.norm.weight"]
    )


def test_a_shared_load_of_another_dtype_is_copied() -> None:
    target = _engine(seed=11)
    state = {k: v.double() for k, v in hf_state_dict(_engine(seed=10).model).items()}
    target.load_state_dict(state, share=True)
    assert all(p.dtype == torch.float32 for p in target.model.parameters())
    assert torch.equal(target.model.model.norm.weight, state["model.norm.weight"].float())


def test_the_trunk_is_computed_again_for_every_version_loaded() -> None:
    trunked = TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=TRUNK)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    trunked.generate(TRUNK + [10], [1], params)
    trunked.load_state_dict(init_model(CFG, seed=4).state_dict())
    assert trunked.prefill.trunk_kv is None
    expected = _engine(seed=4).generate(TRUNK + [10], [1], params)
    assert trunked.generate(TRUNK + [10], [1], params)[0].logprobs == pytest.approx(
        expected[0].logprobs, abs=1e-5
    )


def test_a_prompt_alone_prefills_the_same_whatever_the_batch() -> None:
    trunked = TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=TRUNK)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    alone = trunked.generate(TRUNK + [12, 13], [7], params)[0]
    batch = trunked.generate_many([([1, 4], [8]), (TRUNK + [12, 13], [7])], params)[1][0]
    assert batch.tokens == alone.tokens
    assert batch.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def _forward_widths(engine: TorchEngine) -> list[int]:
    """The widths of the model's forwards from now on (a list the caller reads)."""
    widths: list[int] = []
    engine.model.register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    return widths


def _padded(engine: TorchEngine, widths: list[int]) -> list[int]:
    """A prefill row's tokens as computed: at least the rows from which each comes out as alone."""
    least = engine._least_rows(weights_first=False)
    return [max(w, least) for w in widths]


def _full_forward_logprobs(engine: TorchEngine, prompt: list[int], tokens: list[int]) -> list[float]:
    """The log-probs (T = 1) of ``tokens`` after ``prompt`` from one plain forward without a cache."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


def test_a_batchs_prompts_prefill_in_one_forward_each_as_if_alone() -> None:
    trunked = TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=TRUNK)
    widths = _forward_widths(trunked)
    prompts = [TRUNK + [10, 11, 12], [1, 4], TRUNK + [12], TRUNK + [13, 14], [6, 3, 8]]
    seeds = [[sample_seed(0, 0, i, 0)] for i in range(len(prompts))]
    params = SamplingParams(max_new_tokens=1, temperature=1.0)
    got = trunked.generate_many(list(zip(prompts, seeds, strict=True)), params)
    # the trunk; the own tokens of the prompts that begin with it; the others whole (a row padded to
    # the rows from which each comes out as alone: invariance.py)
    assert widths == [len(TRUNK), *_padded(trunked, [3 + 1 + 2, 2 + 3])]
    for prompt, group in zip(prompts, got, strict=True):
        expected = _full_forward_logprobs(trunked, prompt, group[0].tokens)
        assert group[0].logprobs == pytest.approx(expected, abs=1e-5)


def test_a_shared_beginning_named_by_the_caller_is_computed_once_and_read_by_each_prompt() -> None:
    trunked = TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=TRUNK)
    widths = _forward_widths(trunked)
    opening = TRUNK + [10, 11, 12, 13, 14, 2, 6]  # an episode's opening, beyond the trunk
    prompts = [opening + [4, 9], opening + [5], opening + [4, 9, 8, 8, 3]]  # turns of three episodes
    seeds = [[sample_seed(0, 0, i, 0)] for i in range(len(prompts))]
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    got = trunked.generate_many(list(zip(prompts, seeds, strict=True)), params, shared=opening)
    # the trunk; the opening's own tokens beyond it; then every prompt's own tokens in one row
    assert widths[:3] == [len(TRUNK), len(opening) - len(TRUNK), *_padded(trunked, [2 + 1 + 5])]
    for prompt, group in zip(prompts, got, strict=True):
        expected = _full_forward_logprobs(trunked, prompt, group[0].tokens)
        assert group[0].logprobs == pytest.approx(expected, abs=1e-5)
    # unnamed, no beginning beyond the trunk is shared, whatever the prompts have in common: each
    # prompt is computed as it would be alone
    widths.clear()
    trunked.generate_many(list(zip(prompts, seeds, strict=True)), params)
    assert widths[:1] == _padded(trunked, [3 * (len(opening) - len(TRUNK)) + 2 + 1 + 5])  # one row
    # without the trunk, the named beginning is computed whole; a prompt that does not begin with it,
    # or a single prompt, is computed whole
    plain = _engine(seed=3)
    widths = _forward_widths(plain)
    other = [10, 11, 4]
    plain.generate_many(list(zip([*prompts, other], [*seeds, [9]], strict=True)), params, shared=opening)
    assert widths[:3] == [len(opening), *_padded(plain, [2 + 1 + 5]), *_padded(plain, [len(other)])]
    widths.clear()
    plain.generate(prompts[0], [1], params)
    assert widths[0] == _padded(plain, [len(prompts[0])])[0]


def test_a_prefill_row_holds_at_most_its_budget_of_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefill_module, "PREFILL_ROW_TOKENS", 4)
    engine = _engine(seed=5)
    widths = _forward_widths(engine)
    prompts = [[1, 4], [6, 3, 8], [9], [5, 7, 3, 1, 6]]
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    got = engine.generate_many([(p, [sample_seed(0, 0, i, 0)]) for i, p in enumerate(prompts)], params)
    # a row, the next two together, the longest alone (each padded as above); then decode
    assert widths[:3] == _padded(engine, [2, 3 + 1, 5])
    for prompt, group in zip(prompts, got, strict=True):
        expected = _full_forward_logprobs(engine, prompt, group[0].tokens)
        assert group[0].logprobs == pytest.approx(expected, abs=1e-5)


def test_a_short_common_beginning_is_no_trunk() -> None:
    assert TorchEngine(init_model(CFG, seed=3), eos_id=EOS, trunk=[1, 5]).trunk == []


def _devices() -> list[str]:
    """Every device kind this host can compute on: the CPU always, a GPU or NPU where there is one."""
    kinds = ["cpu"]
    if torch.cuda.is_available():
        kinds.append("cuda")
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        kinds.append("npu")
    return kinds


@pytest.mark.parametrize("device", _devices())
def test_the_engine_generates_on_its_device_what_it_generates_on_the_cpu(device: str) -> None:
    """Weights loaded onto the device from pulled bytes (CPU tensors), KV cache, sampling and
    log-probs there: the same tokens as on the CPU (the random numbers are drawn on the CPU), log-probs
    within what another device's kernels round differently."""
    params = SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.95)
    seeds = [sample_seed(0, 3, 1, i) for i in range(4)]
    source = _engine(seed=12)
    pulled = state_dict_from_bytes(state_dict_to_bytes(source.model))
    here = TorchEngine(init_model(CFG, seed=13), eos_id=EOS, device=device, trunk=PROMPT[:2])
    here.load_state_dict(pulled, share=True)  # another device: copied onto it, never shared
    assert all(p.device.type == device for p in here.model.parameters())
    got = here.generate_many([(PROMPT, seeds), ([1, 8], seeds[:2])], params)
    want = source.generate_many([(PROMPT, seeds), ([1, 8], seeds[:2])], params)
    for ours, theirs in zip(got, want, strict=True):
        assert [c.tokens for c in ours] == [c.tokens for c in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


GROUP_PROMPTS = [[1, 5, 9, 4, 7], [1, 8], [3, 3, 6, 1, 5, 9, 12, 4], [6, 3, 8], [9, 9, 4], [5, 7, 3, 1, 6]]


def _decode_rows(engine: TorchEngine) -> list[int]:
    """The rows each decode step computes from now on (its bucket; a list the caller reads)."""
    rows: list[int] = []
    step = engine._run_step

    def counted(
        tokens: torch.Tensor, positions: torch.Tensor, write_at: torch.Tensor, width: int, live: int
    ) -> torch.Tensor:
        rows.append(tokens.shape[0])
        return step(tokens, positions, write_at, width, live)

    engine._run_step = counted  # type: ignore[method-assign]
    return rows


def test_each_group_is_told_once_at_the_step_its_last_sample_ends() -> None:
    engine = _engine(seed=6)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    groups = [(p, [sample_seed(0, 0, i, j) for j in range(2)]) for i, p in enumerate(GROUP_PROMPTS)]
    groups.insert(3, (PROMPT, []))
    plain = engine.generate_many(groups, params)
    steps = _decode_rows(engine)
    told: list[tuple[int, list[Completion], int]] = []  # (group, completions, decode steps so far)
    got = engine.generate_many(groups, params, ended=lambda i, c: told.append((i, c, len(steps))))
    assert got == plain  # the same tokens and log-probs, bit for bit
    assert sorted(i for i, _, _ in told) == list(range(len(groups)))
    assert all(completions == got[i] for i, completions, _ in told)
    # a group ends at the step its last sample ends (on eos, or at the last step)
    end = {i: max((len(c.tokens) - 1 for c in group), default=-1) for i, group in enumerate(got)}
    assert [i for i, _, _ in told] == sorted(end, key=lambda i: (end[i], i))
    decoded = max(end.values())  # the decode steps: one after every token but the first
    assert len(steps) == decoded
    assert told[0] == (3, [], 0)  # no seeds: told before anything is computed
    for i, _, seen in told[1:]:
        assert seen == end[i]  # told right after its last step, before the next one
    assert min(end[i] for i, _, _ in told[1:]) < decoded  # some group was told while others went on


def _greedy_groups() -> tuple[TorchEngine, list[tuple[list[int], list[int]]], SamplingParams]:
    """Greedy samples, the eos the one the first group samples at once: the tiny model repeats a
    prompt's last token, so the first group's samples end at their first step and the others' run to
    the limit."""
    engine = TorchEngine(init_model(CFG, seed=6), eos_id=7)
    groups = [
        ([1, 5, 9, 4, 7], [1, 2]),
        ([3, 3, 6, 1, 5, 9, 12, 4], [3, 4, 5]),
        ([6], []),
        ([6, 3, 8], [6, 7]),
    ]
    return engine, groups, SamplingParams(max_new_tokens=10, temperature=0.0)


def _stopping(after: int, groups: set[int]) -> tuple[Callable[[], set[int]], list[int]]:
    """A ``stopped`` that names ``groups`` from its poll ``after + 1`` on, and its polls' count."""
    polls = [0]

    def stopped() -> set[int]:
        polls[0] += 1
        return groups if polls[0] > after else set()

    return stopped, polls


def test_a_stopped_group_leaves_the_batch_at_once_and_is_never_told() -> None:
    engine, groups, params = _greedy_groups()
    plain = engine.generate_many(groups, params)
    assert [len(c.tokens) for c in plain[0]] == [1, 1] and all(len(c.tokens) == 10 for c in plain[1])
    rows = _decode_rows(engine)
    told: list[int] = []
    stopped, polls = _stopping(after=3, groups={0, 1, 2})  # 0 and 2 have ended already: ignored
    got = engine.generate_many(groups, params, ended=lambda i, _: told.append(i), stopped=stopped)
    assert told == [2, 0, 3] and polls[0] == params.max_new_tokens - 1  # polled between two steps
    assert got[0] == plain[0] and got[1] == [] and got[2] == []
    assert [c.tokens for c in got[3]] == [c.tokens for c in plain[3]]
    for a, b in zip(got[3], plain[3], strict=True):  # fewer rows may round otherwise
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    # group 0's rows ended on their first token and left before any step, group 1's at the fourth
    # poll; group 3's two rows then move into the lowest slots: the steps compute two rows, not eight
    # (eager on the CPU a step computes the rows held, no bucket: five, then two; padded to the rows
    # from which each comes out as alone, invariance.py)
    live = [5, 5, 5] + [2] * (params.max_new_tokens - 4)
    assert engine.last_call.live == live
    least = engine._least_rows(weights_first_here(engine.device))
    assert rows == [min(max(n, least), engine.rows) for n in live]


def test_stopping_every_group_left_returns_at_once() -> None:
    engine, groups, params = _greedy_groups()
    rollout = TorchRolloutEngine(engine, params)
    rows = _decode_rows(engine)
    plain = rollout.generate_many(groups)
    full = len(rows)
    rows.clear()
    stopped, polls = _stopping(after=2, groups={0, 1, 2, 3})  # 0 and 2 ended already: kept
    got = rollout.generate_many(groups, stopped=stopped)
    assert got == [plain[0], [], [], []] and polls[0] == 3
    assert full == params.max_new_tokens - 1 and len(rows) == 2  # two decode steps of nine
