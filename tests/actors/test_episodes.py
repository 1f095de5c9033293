"""Episodes on the real built-in engine and real tokenizers: token in, token out. The final ids are the
prompt's, then exactly what the engine sampled and the environment's message ids, in order across turn
boundaries; the mask marks exactly the sampled ids; each log-prob is the one a forward over the final
ids gives (what the trainer will compute). SmolLM2's tokenizer and weights are used when cached."""

from __future__ import annotations

import asyncio
import string
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.model.config import ModelConfig
from cadence.model.engine import Completion, JoinedGroup, SamplingParams, TorchEngine, prompt_trunk
from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.tokenizer import CharTokenizer, TextTokenizer
from cadence.model.transformer import Transformer, init_model
from cadence.model.turns import render
from cadence.rollout.play import EngineGenerate
from cadence.rollout.streaming import episode_runner
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.episode_record import EpisodeResult
from cadence.tasks.environments.generation import turn_seed
from tests.turns import JoinWaiting

ReplyIds = Callable[[str, bool], list[int]]
SMOLLM2 = Path.home() / ".cache" / "cadence" / "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(),
    reason=f"SmolLM2 is not at {SMOLLM2} (`make smollm2` puts it there)",
)
CHARS = CharTokenizer(string.ascii_letters + string.digits + string.punctuation + " ")


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Recording(TorchEngine):
    """The built-in engine, keeping every (prompt, seed) it was asked and the completion it gave."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sampled: dict[int, tuple[list[int], Completion]] = {}  # seed -> (prompt, completion)

    def generate_many(
        self, groups: Sequence[tuple[Sequence[int], Sequence[int]]], params: SamplingParams, **kwargs: Any
    ) -> list[list[Completion]]:
        joined: list[JoinedGroup] = []  # the turns that joined the call, in order
        if (joining := kwargs.get("joining")) is not None:

            def recorded(room: int) -> Sequence[JoinedGroup]:
                more = joining(room)
                joined.extend(more)
                return more

            kwargs["joining"] = recorded
        out = super().generate_many(groups, params, **kwargs)
        for (prompt, seeds, *_), completions in zip([*groups, *joined], out, strict=True):
            for seed, completion in zip(seeds, completions, strict=True):
                self.sampled[seed] = (list(prompt), completion)
        return out


class Counting(TorchEngine):
    """The built-in engine, counting its `generate_many` calls."""

    calls = 0

    def generate_many(self, *args: Any, **kwargs: Any) -> list[list[Completion]]:
        self.calls += 1
        return super().generate_many(*args, **kwargs)


class Chatter(Environment):
    """Asks for a word, then for another, until the runner's max_turns."""

    name = "chatter"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt

    async def start(self) -> str:
        return self.prompt.text

    async def step(self, response: str) -> Reply:
        return Reply("Another one, in one word.")

    async def score(self, transcript: Transcript) -> Score:
        return Score(reward=float(len(transcript.responses)), correct=0.0)


def _expected_ids(
    engine: Recording, result: EpisodeResult, reply_ids: ReplyIds
) -> tuple[list[int], list[int]]:
    """The ids and mask an episode must hold, rebuilt from what the engine sampled turn by turn (and
    checking each turn was asked with exactly the ids before it); `reply_ids(message, finished)` the
    environment's ids as the test expects them."""
    ids, mask = list(result.prompt_tokens), [0] * len(result.prompt_tokens)
    # the messages the model read (a message past the budget is in the transcript with no tokens)
    messages = [t.text for t in result.turns[2::2] if t.tokens]
    for turn in range(result.model_turns):
        prompt, completion = engine.sampled[turn_seed(result.seed, turn)]
        assert prompt == ids, f"turn {turn} was not asked with the ids held before it"
        ids += completion.tokens
        mask += [1] * len(completion.tokens)
        if turn < len(messages):
            message = reply_ids(messages[turn], completion.finished)
            ids += message
            mask += [0] * len(message)
    return ids, mask


def _check_token_in_token_out(engine: Recording, result: EpisodeResult, reply_ids: ReplyIds) -> None:
    ids, mask = _expected_ids(engine, result, reply_ids)
    assert result.prompt_tokens + result.tokens == ids
    assert [0] * len(result.prompt_tokens) + result.mask == mask
    assert result.env_tokens == result.mask.count(0)
    # each sampled id's log-prob is the one a forward over the final ids gives it (temperature 1)
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids]))[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    n = len(result.prompt_tokens)
    for i, (token, sampled) in enumerate(zip(result.tokens, result.mask, strict=True)):
        expected = float(logprobs[n + i - 1, token]) if sampled else 0.0
        assert result.logprobs[i] == pytest.approx(expected, abs=2e-4), f"position {i}"


def _run(
    engine: TorchEngine, tokenizer: TextTokenizer, bounds: Bounds, episodes: list[tuple[Prompt, int]]
) -> list[EpisodeResult]:
    worker = TorchRolloutEngine(engine, SamplingParams(max_new_tokens=1, temperature=1.0))
    return asyncio.run(episode_runner(worker, tokenizer, Chatter, bounds).run(episodes))


def _tiny(tokenizer: TextTokenizer, max_position: int = 256) -> Transformer:
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=64, max_position=max_position,
    )  # fmt: skip
    return init_model(cfg, seed=0)


@pytest.mark.timeout(60)
def test_char_tokenizer_episodes_are_the_engines_ids_and_the_messages_ids() -> None:
    engine = Recording(_tiny(CHARS), CHARS.eos_id)
    prompt = Prompt(0, "Say a word.", "")
    results = _run(engine, CHARS, Bounds(max_turns=3, max_turn_tokens=6), [(prompt, s) for s in range(6)])
    for result in results:
        _check_token_in_token_out(engine, result, lambda message, finished: CHARS.encode(message))
        assert result.ended == "max_turns" and result.model_turns == 3
    # the first turn is the single-turn sample of the episode's seed
    alone = engine.generate(CHARS.encode_prompt("Say a word."), [4], SamplingParams(max_new_tokens=6))[0]
    assert results[4].tokens[: len(alone.tokens)] == alone.tokens


@pytest.mark.timeout(60)
def test_an_episode_ends_when_the_engine_has_no_room() -> None:
    engine = Recording(_tiny(CHARS, max_position=40), CHARS.eos_id)
    (result,) = _run(
        engine, CHARS, Bounds(max_turns=20, max_turn_tokens=8), [(Prompt(0, "Say a word.", ""), 3)]
    )
    assert result.ended == "context" and len(result.prompt_tokens) + len(result.tokens) <= 40
    _check_token_in_token_out(engine, result, lambda message, finished: CHARS.encode(message))


def _chatml(tokenizer: HFTokenizer) -> ReplyIds:
    """SmolLM2's turn boundary as the test writes it out, not read off the template."""

    def reply_ids(message: str, finished: bool) -> list[int]:
        closing = "" if finished else "<|im_end|>"
        return tokenizer.encode(f"{closing}\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n")

    return reply_ids


@needs_smollm2
@pytest.mark.timeout(120)
def test_smollm2_template_on_a_tiny_model_closes_turns_cut_at_their_limit() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    engine = Recording(_tiny(tokenizer), tokenizer.eos_id, trunk=prompt_trunk(tokenizer))
    prompt = Prompt(0, "Name a colour, in one word.", "")
    results = _run(engine, tokenizer, Bounds(max_turns=3, max_turn_tokens=5), [(prompt, s) for s in range(3)])
    for result in results:
        _check_token_in_token_out(engine, result, _chatml(tokenizer))


@needs_smollm2
@pytest.mark.timeout(300)
def test_smollm2_episodes_are_token_in_token_out_and_render_as_the_template() -> None:
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.skip(f"SmolLM2's weights are not at {SMOLLM2}")
    from cadence.model.checkpoint import load_checkpoint

    tokenizer = HFTokenizer(SMOLLM2)
    model, _ = load_checkpoint(SMOLLM2)
    engine = Recording(model, tokenizer.eos_id, trunk=prompt_trunk(tokenizer))
    prompt = Prompt(0, "Name a colour, in one word.", "")
    results = _run(
        engine, tokenizer, Bounds(max_turns=3, max_turn_tokens=12), [(prompt, s) for s in range(4)]
    )
    finished = set()
    for result in results:
        _check_token_in_token_out(engine, result, _chatml(tokenizer))
        for turn in range(result.model_turns):
            finished.add(engine.sampled[turn_seed(result.seed, turn)][1].finished)
        messages = [
            {"role": "user" if t.author == "environment" else "assistant", "content": t.text}
            for t in result.turns
        ]
        text = tokenizer.decode(result.prompt_tokens + result.tokens, skip_special=False)
        closing = "\n" if result.finished else "<|im_end|>\n"  # the template's end of the last turn
        assert text + closing == render(tokenizer, messages, False)
    # with these seeds some turns end on eos and some at their limit: both boundaries are exercised
    assert finished == {True, False}, "pick other seeds: every turn ended the same way"


def test_engine_generate_clips_to_the_models_positions_and_keeps_the_order() -> None:
    engine = Recording(_tiny(CHARS, max_position=30), CHARS.eos_id)
    generate = EngineGenerate(TorchRolloutEngine(engine, SamplingParams(max_new_tokens=1, temperature=1.0)))
    short, long = CHARS.encode_prompt("Hi"), CHARS.encode_prompt("x" * 29)
    out = asyncio.run(generate([long, short, short], [1, 2, 3], [8, 4, 8]))
    assert out[0].tokens == [] and not out[0].finished  # 30 positions hold no new token after 30
    assert 1 <= len(out[1].tokens) <= 4 and 1 <= len(out[2].tokens) <= 8
    assert out[2].tokens == engine.generate(short, [3], SamplingParams(max_new_tokens=8))[0].tokens


def test_turns_of_different_room_decode_in_one_call_as_they_would_apart() -> None:
    """The built-in engine takes a token limit a group: turns of rooms 2, 5 and 9 are one call, each
    turn what a call of its own room samples, bit for bit."""
    engine = Counting(_tiny(CHARS, max_position=60), CHARS.eos_id)
    generate = EngineGenerate(TorchRolloutEngine(engine, SamplingParams(max_new_tokens=1, temperature=1.0)))
    prompts = [CHARS.encode_prompt(text) for text in ("Hi", "Say a word", "Go on")]
    out = asyncio.run(generate(prompts, [4, 5, 6], [2, 9, 5]))
    assert engine.calls == 1
    for prompt, seed, room, turn in zip(prompts, [4, 5, 6], [2, 9, 5], out, strict=True):
        (alone,) = engine.generate(prompt, [seed], SamplingParams(max_new_tokens=room))
        assert (turn.tokens, turn.logprobs, turn.finished) == (alone.tokens, alone.logprobs, alone.finished)
        assert 1 <= len(turn.tokens) <= room


class Pausing(Chatter):
    """Chatter whose replies take 0 to 30 ms, by the episode's seed and turn."""

    def __init__(self, prompt: Prompt, seed: int) -> None:
        super().__init__(prompt, seed)
        self.seed, self.turns = seed, 0

    async def step(self, response: str) -> Reply:
        self.turns += 1
        await asyncio.sleep(((self.seed * 7 + self.turns * 3) % 4) * 0.01)
        return await super().step(response)


class Waiting(JoinWaiting, Recording):
    """The recording engine that waits for a join in its first call (`JoinWaiting`)."""


@pytest.mark.timeout(120)
def test_an_episodes_next_turn_joins_the_running_call_and_samples_what_it_samples_alone() -> None:
    """Episodes whose environments reply after different pauses: their later turns join the engine's
    running call instead of waiting for the batch's slowest turn, and every turn is, bit for bit,
    what the engine samples for its context and seed alone (with the batch's shared beginning), so
    the episodes come out the same whatever the pauses."""
    bounds = Bounds(max_turns=4, max_turn_tokens=6)
    episodes = [(Prompt(0, "Say a word.", ""), s) for s in range(6)]
    worker = Waiting(_tiny(CHARS), CHARS.eos_id, rows=16)
    runner = episode_runner(
        TorchRolloutEngine(worker, SamplingParams(6, temperature=1.0)), CHARS, Pausing, bounds
    )
    paused = asyncio.run(runner.run(episodes))
    assert runner.joined_turns > 0 and worker.joined > 0
    quick = Recording(_tiny(CHARS), CHARS.eos_id, rows=16)
    at_once = _run(quick, CHARS, bounds, episodes)
    assert [(r.tokens, r.logprobs, r.mask) for r in paused] == [
        (r.tokens, r.logprobs, r.mask) for r in at_once
    ]
    shared = CHARS.encode_prompt("Say a word.")[:-1]  # what every context begins with
    alone = TorchEngine(_tiny(CHARS), CHARS.eos_id, rows=16)
    for seed, (prompt, completion) in worker.sampled.items():  # a turn cut at its room: the first tokens
        ((mine,),) = alone.generate_many(
            [(prompt, [seed])], SamplingParams(6, temperature=1.0), shared=shared
        )
        assert mine.tokens[: len(completion.tokens)] == completion.tokens
        assert mine.logprobs[: len(completion.tokens)] == completion.logprobs
