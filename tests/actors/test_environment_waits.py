"""A worker's environment waits: with `waits`, `Episodes.run` logs the time inside environment calls as
"environment" spans, one a stretch between the model's turns, and leaves the episodes as they were.
The model is scripted (the only fake, at the engine's edge); the runner, tokenizer and chat turns are
real."""

from __future__ import annotations

import asyncio
import itertools
import string
from collections.abc import Sequence
from typing import Any

import pytest
import structlog
from msgspec.structs import replace

from cadence.model.tokenizer import CharTokenizer
from cadence.model.turns import ChatTurns
from cadence.monitor.span import Overlapping
from cadence.rollout.play import Episodes
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Environment, Reply, Transcript
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated, turn_seed

pytestmark = pytest.mark.timeout(30)

TOKENIZER = CharTokenizer(string.ascii_letters + string.digits + string.punctuation + " \n")
PROMPT = Prompt(3, "Call the tool until it is done.", "done")
# sample seed -> the model's turns: seed 1 is done at once, seed 2 calls the tool once first
SCRIPTS = {1: ["done"], 2: ["call", "done"]}


class Tool(Environment):
    """Answers every turn after a turn of the event loop (a tool that awaits); "done" ends the episode."""

    name = "tool"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt

    async def start(self) -> str:
        await asyncio.sleep(0)
        return self.prompt.text

    async def step(self, response: str) -> Reply:
        await asyncio.sleep(0)
        return Reply("result", done=response == "done", tool_calls=int(response == "call"))

    async def score(self, transcript: Transcript) -> Score:
        right = float(transcript.last_response == self.prompt.answer)
        return Score(reward=right, correct=right)


class Scripted:
    """The model: each episode's scripted turn (by its turn seed), ended on eos; when each call came,
    read from the test's clock."""

    max_context = 10_000

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.turns = {
            turn_seed(seed, t): texts[t] for seed, texts in SCRIPTS.items() for t in range(len(texts))
        }
        self.called: list[float] = []

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        self.called.append(self.clock())
        out = []
        for seed in seeds:
            ids = [*TOKENIZER.encode(self.turns[seed]), TOKENIZER.eos_id]
            out.append(Generated(ids, [-0.5] * len(ids), True))
        return out


def _episodes(factory: Any = Tool) -> Episodes:
    return Episodes("tool", factory, ChatTurns(TOKENIZER), Bounds(max_turns=4))


async def test_each_stretch_between_the_models_turns_is_one_environment_span() -> None:
    clock = itertools.count(1.0).__next__  # one clock for the model's calls and the spans
    model = Scripted(clock)
    waits = Overlapping(clock, "environment", period=5, eval=False)
    groups = [(PROMPT, [1, 2], TOKENIZER.encode_prompt(PROMPT.text))]
    with structlog.testing.capture_logs() as logs:
        (timed,) = await _episodes().run(model, groups, TOKENIZER.eos_id, waits)
    spans = [e for e in logs if e["event"] == "span"]
    assert all(e["kind"] == "environment" and e["period"] == 5 and e["eval"] is False for e in spans)
    # the two starts; both first turns' steps; the second episode's next step, the two scores and
    # closes: every call in exactly one span. Each episode's calls run on its own thread, so calls
    # that overlap are one stretch and calls that do not are two, and the first episode's score and
    # close may still run while the model takes the second's next turn (a stretch then spans that
    # call): the starts alone come before the model's first turn, every other call after it
    first, _ = model.called
    assert all(e["calls"] >= 1 for e in spans) and sum(e["calls"] for e in spans) == 2 + 2 + 1 + 4
    assert sum(e["calls"] for e in spans if e["end"] < first) == 2
    assert all(e["start"] > first for e in spans if e["end"] > first)
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(spans))  # stretches never overlap

    # the environments' answers are untouched: the same groups as without the spans
    (plain,) = await _episodes().run(Scripted(clock), groups, TOKENIZER.eos_id)
    assert (timed.completions, timed.logprobs, timed.scores) == (
        plain.completions,
        plain.logprobs,
        plain.scores,
    )
    assert timed.episodes is not None and plain.episodes is not None
    assert replace(timed.episodes, env_s=[], env_wall_s=0.0) == replace(
        plain.episodes, env_s=[], env_wall_s=0.0
    )  # times
    assert timed.episodes.turns == [1, 2] and timed.episodes.tool_calls == [0, 1]
    assert [s.reward for s in timed.scores] == [1.0, 1.0]


async def test_a_factory_that_makes_no_environment_is_still_refused_by_the_runner() -> None:
    clock = itertools.count(1.0).__next__
    waits = Overlapping(clock, "environment", period=0)
    groups = [(PROMPT, [1], TOKENIZER.encode_prompt(PROMPT.text))]
    with structlog.testing.capture_logs() as logs:
        (made,) = await _episodes(lambda prompt, seed: "no environment").run(
            Scripted(clock), groups, TOKENIZER.eos_id, waits
        )
    assert made.episodes is not None and made.episodes.endings == ["error"]
    assert [e["stage"] for e in logs if e["event"] == "environment_failed"] == ["create"]
    assert not [e for e in logs if e["event"] == "span"]  # no call into an environment was made
