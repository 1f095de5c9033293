"""The built-in environments (calculator, guess the number) and loading an environment by name."""

from __future__ import annotations

import asyncio

import pytest

from cadence.config import ConfigError
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import (
    ChatMessage,
    Environment,
    Reply,
    Transcript,
    Turn,
    opening_problem,
    opening_text,
)
from cadence.tasks.environments.calculator import EXAMPLE, INSTRUCTIONS, MAX_CALLS, Calculator
from cadence.tasks.environments.guess import GuessNumber
from cadence.tasks.environments.loading import load_environment

pytestmark = pytest.mark.timeout(30)

QUESTION = Prompt(7, "What is 12 * (3 + 4)? Answer with the number only.", "84")


def _transcript(*responses: str) -> Transcript:
    turns = [Turn("environment", "first", 1)]
    for text in responses:
        turns += [Turn("model", text, 1), Turn("environment", "reply", 1)]
    return Transcript(tuple(turns), "done")


class Echo(Environment):
    """A user's environment, loaded by name below."""

    name = "echo"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt = prompt

    async def start(self) -> str:
        return self.prompt.text

    async def step(self, response: str) -> Reply:
        return Reply(response, done=True)

    async def score(self, transcript: Transcript) -> Score:
        return Score(reward=1.0, correct=1.0)


def make_echo(prompt: Prompt, seed: int) -> Environment:
    return Echo(prompt, seed)


NOT_CALLABLE = 3


async def test_the_calculator_answers_calls_and_ends_on_an_answer() -> None:
    env = Calculator(QUESTION, seed=1)
    first = await env.start()
    assert first == [ChatMessage("system", INSTRUCTIONS), *EXAMPLE, ChatMessage("user", QUESTION.text)]
    assert opening_problem(first) is None
    assert "<calc>" in first[0].content and [m.role for m in EXAMPLE] == ["user", "assistant"] * 2
    # the example's call, answered by this calculator, is the example's result
    assert (await env.step(EXAMPLE[1].content)).message == EXAMPLE[2].content
    reply = await env.step("Let me compute. <calc>12*(3+4)</calc>")
    assert reply == Reply("<result>84</result>", tool_calls=1)
    reply = await env.step("<calc>1/0</calc> and <calc>7/2</calc>")
    assert reply.message == "<result>error: division by zero</result>\n<result>3.5</result>"
    assert (reply.tool_calls, reply.tool_errors, reply.done) == (2, 1, False)
    assert (await env.step("84")).done


async def test_the_calculator_runs_at_most_its_calls_a_turn() -> None:
    reply = await Calculator(QUESTION, 0).step("<calc>1+1</calc>" * (MAX_CALLS + 3))
    assert reply.tool_calls == MAX_CALLS
    assert reply.message.count("<result>2</result>") == MAX_CALLS
    assert f"at most {MAX_CALLS} calls a turn" in reply.message


@pytest.mark.parametrize(
    ("responses", "correct"),
    [
        (("<calc>12*7</calc>", "The answer is 84."), 1.0),
        (("<calc>12*7</calc>", "85"), 0.0),
        (("84 <calc>12*7</calc>",), 0.0),  # still calling when it ended: no answer
        ((), 0.0),
        (("\\boxed{84}",), 1.0),
    ],
)
async def test_the_calculator_scores_the_last_answer_with_the_math_check(
    responses: tuple[str, ...], correct: float
) -> None:
    score = await Calculator(QUESTION, 0).score(_transcript(*responses))
    assert score == Score(reward=correct, correct=correct, parts={"answer": correct})


async def test_guess_the_number_is_found_by_bisection_with_its_feedback() -> None:
    for prompt_id in range(20):
        env = GuessNumber(Prompt(prompt_id, "guess", ""), seed=prompt_id)
        assert f"from 1 to {env.high}" in await env.start()
        low, high, turns = 1, env.high, []
        while True:
            guess = (low + high) // 2
            turns.append(f"My guess is {guess}.")
            reply = await env.step(turns[-1])
            assert reply.reward == 1.0  # bisection only ever makes possible guesses
            if reply.done:
                assert reply.message == "Correct!" and guess == env.number
                break
            assert reply.message in ("Higher.", "Lower.")
            low, high = (guess + 1, high) if reply.message == "Higher." else (low, guess - 1)
        assert len(turns) <= 7
        score = await env.score(_transcript(*turns))
        assert score.correct == 1.0 and score.reward == pytest.approx(0.9 ** (len(turns) - 1))


async def test_guess_the_number_rewards_only_possible_guesses_and_asks_for_a_number() -> None:
    env = GuessNumber(Prompt(3, "guess", ""), seed=0)
    assert await env.step("no idea") == Reply("Answer with one whole number.", reward=0.0)
    below = await env.step("0")  # outside 1..N: impossible, and the number is higher
    assert below == Reply("Higher.", reward=0.0)
    huge = await env.step("9" * 5000)  # never turned into a 5000-digit int
    assert huge == Reply("Lower.", reward=0.0)
    score = await env.score(_transcript("no idea", "0", "9"))
    assert score == Score(reward=0.0, correct=0.0, parts={"solved": 0.0})


def test_guess_the_number_is_one_game_for_one_prompt_whatever_the_sample_seed() -> None:
    prompt = Prompt(11, "guess", "")
    games = {(g.high, g.number) for g in (GuessNumber(prompt, seed) for seed in range(10))}
    assert len(games) == 1
    others = {(g.high, g.number) for g in (GuessNumber(Prompt(i, "guess", ""), 0) for i in range(40))}
    assert len(others) > 10


def test_built_in_and_user_environments_load_by_name() -> None:
    assert load_environment("calculator") is Calculator
    assert load_environment("guess_number") is GuessNumber
    factory = load_environment("tests.unit.test_environments:make_echo")
    env = factory(QUESTION, 0)
    assert isinstance(env, Echo) and asyncio.run(env.start()) == QUESTION.text
    assert load_environment("tests.unit.test_environments:Echo") is Echo


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("chess", "environment.name: 'chess' is neither a built-in environment"),
        ("no_such_module_here:make", "environment.name: cannot import 'no_such_module_here'"),
        ("tests.unit.test_environments:missing", "has no 'missing'"),
        ("tests.unit.test_environments:NOT_CALLABLE", "is a int, not a callable factory"),
    ],
)
def test_a_bad_name_is_refused_naming_the_key(name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_environment(name)


@pytest.mark.parametrize(
    ("opening", "problem"),
    [
        ("Hi", None),
        ([ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")], None),
        ([], "not a str or a non-empty sequence of ChatMessage"),
        (7, "start gave a int"),
        ([("user", "Hi")], "not all ChatMessage"),
        ([ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello")], "ends on a assistant message"),
        ([ChatMessage("robot", "Hi")], "role is not system, user, assistant or tool"),  # type: ignore[arg-type]
        ([ChatMessage("user", 3)], "not all ChatMessage of str content"),  # type: ignore[arg-type]
    ],
)
def test_what_start_may_give(opening: object, problem: str | None) -> None:
    found = opening_problem(opening)
    assert found == problem if problem is None else (found is not None and problem in found)


def test_an_opening_reads_as_its_messages_in_a_transcript() -> None:
    assert opening_text("Hi") == "Hi"
    opening = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert opening_text(opening) == "system: Be brief.\n\nuser: Hi"
