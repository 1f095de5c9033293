"""The episode runner on a scripted model (the only fake: the generate function at the edge), real
environments and a real tokenizer: token in and token out, the mask, the bounds, failures contained."""

from __future__ import annotations

import asyncio
import string
from collections.abc import Sequence

import pytest
import structlog

from cadence.model.tokenizer import CharTokenizer
from cadence.model.turns import ChatTurns
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import ChatMessage, Environment, Reply, Transcript, opening_text
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.calculator import Calculator
from cadence.tasks.environments.generation import Generated, turn_seed
from cadence.tasks.environments.guess import GuessNumber
from cadence.tasks.environments.runner import EpisodeRunner

pytestmark = pytest.mark.timeout(30)

TOKENIZER = CharTokenizer(string.ascii_letters + string.digits + string.punctuation + " \n")
CODEC = ChatTurns(TOKENIZER)
EOS = TOKENIZER.eos_id
QUESTION = Prompt(4, "What is 12 * (3 + 4)?", "84")


class Scripted:
    """A model that writes each episode's scripted turns (by its sample seed), a log-prob a token
    of -(position + 1) / 100, and ends each turn on eos unless cut at its limit; its calls recorded."""

    def __init__(self, scripts: dict[int, list[str]], max_context: int = 100_000) -> None:
        self.max_context = max_context
        self.turns = {turn_seed(seed, t): (seed, t) for seed, texts in scripts.items() for t in range(50)}
        self.scripts = scripts
        self.calls: list[tuple[list[list[int]], list[int], list[int]]] = []

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        self.calls.append(([list(p) for p in prompts], list(seeds), list(max_new_tokens)))
        out = []
        for seed, limit in zip(seeds, max_new_tokens, strict=True):
            episode, turn = self.turns[seed]
            texts = self.scripts[episode]
            ids = [*TOKENIZER.encode(texts[min(turn, len(texts) - 1)]), EOS][:limit]
            out.append(Generated(ids, [-(i + 1) / 100 for i in range(len(ids))], ids[-1] == EOS))
        return out


def _runner(generate: Scripted, factory: object = Calculator, **bounds: float) -> EpisodeRunner:
    return EpisodeRunner(factory, generate, CODEC, Bounds(**bounds))  # type: ignore[arg-type]


def _turn(text: str) -> list[int]:
    return [*TOKENIZER.encode(text), EOS]


async def test_an_episode_is_the_prompt_then_model_and_environment_ids_in_order() -> None:
    model = Scripted({5: ["<calc>12*(3+4)</calc>", "The answer is 84."]})
    (result,) = await _runner(model).run([(QUESTION, 5)])
    first = await Calculator(QUESTION, 5).start()
    reply = TOKENIZER.encode("<result>84</result>")
    assert result.prompt_tokens == CODEC.encode_prompt(first)
    assert result.tokens == _turn("<calc>12*(3+4)</calc>") + reply + _turn("The answer is 84.")
    n1, n2 = len(_turn("<calc>12*(3+4)</calc>")), len(_turn("The answer is 84."))
    assert result.mask == [1] * n1 + [0] * len(reply) + [1] * n2
    assert result.logprobs == [-(i + 1) / 100 for i in range(n1)] + [0.0] * len(reply) + [
        -(i + 1) / 100 for i in range(n2)
    ]
    assert [(t.author, t.text) for t in result.turns] == [
        ("environment", opening_text(first)),
        ("model", "<calc>12*(3+4)</calc>"),
        ("environment", "<result>84</result>"),
        ("model", "The answer is 84."),
    ]
    assert (result.ended, result.model_turns, result.tool_calls, result.tool_errors) == ("done", 2, 1, 0)
    assert result.env_tokens == len(reply) and result.finished
    assert result.score == Score(reward=1.0, correct=1.0, parts={"answer": 1.0})
    assert result.turn_rewards == [None, None]
    # token in: each turn's context is exactly the ids held so far, seeded by the turn's seed
    (first_context,), (second_context,) = model.calls[0][0], model.calls[1][0]
    assert first_context == result.prompt_tokens
    assert second_context == result.prompt_tokens + _turn("<calc>12*(3+4)</calc>") + reply
    assert [call[1] for call in model.calls] == [[5], [turn_seed(5, 1)]]


async def test_every_live_episode_takes_its_turn_in_one_call() -> None:
    model = Scripted({1: ["84"], 2: ["<calc>2*42</calc>", "84"], 3: ["<calc>1</calc>"] * 2 + ["84"]})
    results = await _runner(model).run([(QUESTION, 1), (QUESTION, 2), (QUESTION, 3)])
    assert [len(call[0]) for call in model.calls] == [3, 2, 1]
    assert [r.model_turns for r in results] == [1, 2, 3]
    assert [r.seed for r in results] == [1, 2, 3] and all(r.score.correct == 1.0 for r in results)


async def test_max_turns_ends_an_episode_after_the_models_last_turn() -> None:
    model = Scripted({9: ["<calc>1+1</calc>"]})
    (result,) = await _runner(model, max_turns=3).run([(QUESTION, 9)])
    assert result.ended == "max_turns" and result.model_turns == 3 and result.tool_calls == 3
    assert result.mask[-1] == 1  # no environment message after the last turn
    assert result.score.reward == 0.0


async def test_the_token_budget_bounds_turns_and_messages() -> None:
    model = Scripted({9: ["<calc>1+1</calc>"]})
    turn, reply = len(_turn("<calc>1+1</calc>")), len(TOKENIZER.encode("<result>2</result>"))
    budget = 2 * (turn + reply) + 5  # room for a third turn of 5 tokens only
    (result,) = await _runner(model, max_tokens=budget).run([(QUESTION, 9)])
    assert [call[2] for call in model.calls] == [[budget], [turn + reply + 5], [5]]
    assert result.ended == "token_budget" and len(result.tokens) == budget
    assert not result.finished and result.model_turns == 3
    small = Scripted({9: ["<calc>1+1</calc>"]})
    (result,) = await _runner(small, max_tokens=turn + reply).run([(QUESTION, 9)])
    assert result.ended == "token_budget" and result.tokens == _turn("<calc>1+1</calc>")  # no room to answer


async def test_the_engines_context_bounds_turns_and_messages() -> None:
    prompt = len(CODEC.encode_prompt(await Calculator(QUESTION, 9).start()))
    turn, reply = len(_turn("<calc>1+1</calc>")), len(TOKENIZER.encode("<result>2</result>"))
    model = Scripted({9: ["<calc>1+1</calc>"]}, max_context=prompt + turn + reply + 3)
    (result,) = await _runner(model).run([(QUESTION, 9)])
    assert [call[2] for call in model.calls] == [[turn + reply + 3], [3]]
    assert result.ended == "context" and len(result.prompt_tokens + result.tokens) == model.max_context
    model = Scripted({9: ["<calc>1+1</calc>"]}, max_context=prompt + turn + reply)
    (result,) = await _runner(model).run([(QUESTION, 9)])
    assert result.ended == "context" and result.tokens == _turn("<calc>1+1</calc>")  # no room to answer
    model = Scripted({9: ["84"]}, max_context=prompt)
    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(model).run([(QUESTION, 9)])
    assert result.ended == "context" and result.tokens == [] and model.calls == []
    # an opening that leaves no room is said, with the figures to fix it by
    (warning,) = [e for e in logs if e["event"] == "episode_without_room"]
    assert (warning["opening_tokens"], warning["max_context"], warning["ending"]) == (
        prompt,
        prompt,
        "context",
    )


async def test_a_turn_cut_at_its_limit_is_answered_and_the_episode_goes_on() -> None:
    model = Scripted({9: ["<calc>2*3</calc>", "6"]})
    limit = len(TOKENIZER.encode("<calc>2*3</calc>"))  # the eos does not fit
    (result,) = await _runner(model, max_turn_tokens=limit).run([(Prompt(1, "2*3?", "6"), 9)])
    assert result.model_turns == 2 and result.ended == "done" and result.score.correct == 1.0
    assert result.tokens[:limit] == TOKENIZER.encode("<calc>2*3</calc>")


class Slow(Environment):
    name = "slow"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.steps = 0

    async def start(self) -> str:
        return "go"

    async def step(self, response: str) -> Reply:
        self.steps += 1
        if self.steps == 1:
            await asyncio.sleep(5)
        return Reply("ok", done=self.steps == 2, reward=0.5)

    async def score(self, transcript: Transcript) -> Score:
        return Score(reward=0.25, correct=0.0)


async def test_a_step_past_its_timeout_becomes_a_message_the_model_reads() -> None:
    model = Scripted({9: ["a", "b"]})
    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(model, Slow, step_timeout_s=0.1).run([(QUESTION, 9)])
    assert [t.text for t in result.turns] == ["go", "a", "[tool timed out after 0.1 s]", "b"]
    assert result.ended == "done" and result.timeouts == 1 and result.turn_rewards == [None, 0.5]
    assert result.score.reward == 0.25 and 0.1 <= result.env_seconds < 2
    (event,) = [e for e in logs if e["event"] == "environment_timed_out"]
    assert event["environment"] == "slow" and event["stage"] == "step" and event["timeout_s"] == 0.1


async def test_an_episode_past_its_time_ends_and_is_scored_as_it_stands() -> None:
    model = Scripted({9: ["a", "b"]})
    (result,) = await _runner(model, Slow, episode_timeout_s=0.2).run([(QUESTION, 9)])
    assert result.ended == "episode_timeout" and result.model_turns == 1 and result.timeouts == 1
    assert result.score.reward == 0.25  # scored by the environment, with its own time


class Broken(Environment):
    """Raises at the stage its prompt's text names."""

    name = "broken"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        if prompt.text == "create":
            raise RuntimeError("cannot make it")
        self.stage = prompt.text
        self.closed = False

    def _maybe(self, stage: str) -> None:
        if self.stage == stage:
            raise RuntimeError(f"broken at {stage}")

    async def start(self) -> str:
        self._maybe("start")
        return "go"

    async def step(self, response: str) -> Reply:
        self._maybe("step")
        return Reply("ok", done=True)

    async def score(self, transcript: Transcript) -> Score:
        self._maybe("score")
        return Score(reward=1.0, correct=1.0)

    async def close(self) -> None:
        self._maybe("close")


@pytest.mark.parametrize("stage", ["create", "start", "step", "score"])
async def test_an_environment_that_raises_is_logged_and_scored_on_error(stage: str) -> None:
    model = Scripted({1: ["a"], 2: ["a"]})
    with structlog.testing.capture_logs() as logs:
        broken, fine = await _runner(model, Broken, on_error=-1.0).run(
            [(Prompt(1, stage, ""), 1), (Prompt(2, "none", ""), 2)]
        )
    assert broken.score == Score(reward=-1.0, correct=0.0, parts={"environment": -1.0})
    assert fine.score == Score(reward=1.0, correct=1.0) and fine.ended == "done"
    (event,) = [e for e in logs if e["event"] == "environment_failed"]
    assert event["stage"] == stage and event["prompt_id"] == 1 and event["exc_info"] is True
    assert event["why"] == (
        "RuntimeError: cannot make it" if stage == "create" else f"RuntimeError: broken at {stage}"
    )
    assert event["environment"] == ("environment" if stage == "create" else "broken")
    assert broken.ended == ("error" if stage != "score" else "done")
    assert len(broken.tokens) == len(broken.mask) == len(broken.logprobs)


async def test_a_failing_close_does_not_change_the_score() -> None:
    model = Scripted({1: ["a"]})
    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(model, Broken).run([(Prompt(1, "close", ""), 1)])
    assert result.score.reward == 1.0 and [e["stage"] for e in logs] == ["close"]


class Wrong(Environment):
    async def start(self) -> str:
        return "go"

    async def step(self, response: str) -> Reply:
        return "not a reply"  # type: ignore[return-value]

    async def score(self, transcript: Transcript) -> Score:
        return Score(reward=float("nan"), correct=0.0)


async def test_wrong_types_and_unreadable_messages_are_contained() -> None:
    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(Scripted({1: ["a"]}), lambda p, s: Wrong()).run([(QUESTION, 1)])
    assert result.ended == "error" and result.score.reward == 0.0
    assert "not a Reply" in logs[0]["why"]
    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(Scripted({1: ["a"]}), lambda p, s: "no").run([(QUESTION, 1)])
    assert result.ended == "error" and "not an Environment" in logs[0]["why"]

    class Accented(Slow):
        async def start(self) -> str:
            return "café"  # 'é' is outside the character tokenizer's alphabet

    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(Scripted({1: ["a"]}), Accented).run([(QUESTION, 1)])
    assert result.ended == "error" and logs[0]["stage"] == "encode" and result.tokens == []


class Opens(Wrong):
    """An environment whose opening is whatever it is made with."""

    def __init__(self, opening: object) -> None:
        self.opening = opening

    async def start(self) -> str:
        return self.opening  # type: ignore[return-value]

    async def step(self, response: str) -> Reply:
        return Reply("", done=True)


async def test_a_conversation_opens_an_episode_and_a_malformed_one_is_contained() -> None:
    opening = [ChatMessage("system", "Add."), ChatMessage("user", "1+1"), ChatMessage("assistant", "2")]
    opening.append(ChatMessage("user", "2+2"))
    (result,) = await _runner(Scripted({1: ["4"]}), lambda p, s: Opens(opening)).run([(QUESTION, 1)])
    assert result.ended == "done" and result.tokens == _turn("4")
    assert result.prompt_tokens == TOKENIZER.encode_prompt(
        "system: Add.\n\nuser: 1+1\n\nassistant: 2\n\nuser: 2+2"
    )
    assert result.turns[0].text == opening_text(opening)
    for bad, why in [(opening[:3], "ends on a assistant message"), ([], "non-empty sequence"), (5, "a int")]:
        with structlog.testing.capture_logs() as logs:
            (result,) = await _runner(Scripted({1: ["4"]}), lambda p, s, b=bad: Opens(b)).run([(QUESTION, 1)])
        assert result.ended == "error" and result.tokens == [] and result.score.reward == 0.0
        assert logs[0]["stage"] == "start" and why in logs[0]["why"]


async def test_a_nan_score_is_scored_on_error_and_a_nan_turn_reward_is_dropped() -> None:
    class NanScore(Slow):
        async def step(self, response: str) -> Reply:
            return Reply("", done=True, reward=float("nan"))

        async def score(self, transcript: Transcript) -> Score:
            return Score(reward=float("nan"), correct=1.0)

    with structlog.testing.capture_logs() as logs:
        (result,) = await _runner(Scripted({1: ["a"]}), NanScore, on_error=0.5).run([(QUESTION, 1)])
    assert result.score.reward == 0.5 and result.ended == "done" and result.turn_rewards == [None]
    assert [e["stage"] for e in logs] == ["step", "score"]


async def test_an_engine_without_room_ends_the_episode() -> None:
    class Full(Scripted):
        async def __call__(
            self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
        ) -> list[Generated]:
            return [Generated([], [], False) for _ in prompts]

    (result,) = await _runner(Full({})).run([(QUESTION, 1)])
    assert result.ended == "context" and result.tokens == [] and result.score.reward == 0.0


async def test_guess_the_number_records_per_turn_rewards() -> None:
    game = GuessNumber(Prompt(3, "guess", ""), 0)
    guesses = ["0", str(game.number)]  # impossible first, then right
    (result,) = await _runner(Scripted({8: guesses}), GuessNumber).run([(Prompt(3, "guess", ""), 8)])
    assert result.turn_rewards == [0.0, 1.0] and result.ended == "done"
    assert result.score == Score(reward=0.9 ** (2 - 1), correct=1.0, parts={"solved": 1.0})


def test_bounds_refuse_values_that_cannot_run() -> None:
    for key, value in [
        ("max_turns", 0),
        ("max_tokens", 0),
        ("step_timeout_s", 0.0),
        ("on_error", float("inf")),
    ]:
        with pytest.raises(ValueError, match=key):
            Bounds(**{key: value})  # type: ignore[arg-type]


async def test_an_engine_failure_is_raised_once_every_environment_is_closed() -> None:
    closed: list[int] = []

    class Counted(Slow):
        def __init__(self, prompt: Prompt, seed: int) -> None:
            super().__init__(prompt, seed)
            self.seed = seed

        async def close(self) -> None:
            closed.append(self.seed)

    class Failing(Scripted):
        async def __call__(
            self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
        ) -> list[Generated]:
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        await _runner(Failing({}), Counted).run([(QUESTION, 1), (QUESTION, 2)])
    assert sorted(closed) == [1, 2]
