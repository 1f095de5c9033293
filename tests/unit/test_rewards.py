"""Reward functions: the math checker on tricky forms, shape rewards, and the weighted scorer."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest
import structlog

from cadence.config import ConfigError, RunConfig, TaskConfig, load_config
from cadence.rewards.base import Sample, get_reward, load_modules, registered, reward
from cadence.rewards.scorer import make_scorer
from cadence.tasks.answers import answers_match, extract_answer, is_correct, normalize
from cadence.tasks.arithmetic import ArithmeticTask
from cadence.tasks.base import Score

EQUIVALENT = [
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("1,000.50", "1000.5"),
    ("1\\,000", "1000"),
    ("10{,}000", "10000"),
    ("+5", "5"),
    ("$5$", "5"),
    ("\\$5", "5"),
    ("5.", "5"),
    ("-3", "−3"),
    ("0.5", "1/2"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "1/2"),
    ("\\tfrac{1}{2}", "0.5"),
    ("\\frac 1 2", "0.5"),
    (".5", "1/2"),
    ("2.50", "2.5"),
    ("2.50", "5/2"),
    ("-\\frac{1}{2}", "-0.5"),
    ("\\frac{-1}{2}", "-1/2"),
    ("\\frac{3}{6}", "\\frac{1}{2}"),
    ("007", "7"),
    ("50%", "50\\%"),
    ("50.0%", "50%"),
    ("10\\text{ cm}", "10"),
    ("\\text{10}", "10"),
    ("\\textbf{(B)}", "B"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("x = 5", "5"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("(1, -2)", "(1.0, -\\frac{4}{2})"),
    ("[1, 2, 3]", "[1,2,3]"),
    ("1, 2", "(1, 2)"),
    ("1, 2", "[1, 2]"),
    ("(5)", "5"),
    ("\\text{No Solution}", "no solution."),
    ("  \\sqrt{2} ", "\\sqrt{2}"),
    ("\\displaystyle \\frac{\\pi}{2}", "\\frac{\\pi}{2}"),
]

DIFFERENT = [
    ("12", "1/2"),  # spaces and slashes are not ignored into one number
    ("1,000", "1.000"),  # decision: a comma groups thousands, a point is decimal, so 1000 != 1
    ("1 000", "1000"),  # spaces between digits are kept: not a number
    ("1 1/2", "11/2"),  # nor is a mixed number read as one
    ("(1,000)", "1000"),  # inside brackets a comma separates elements: the pair (1, 0)
    ("50%", "50"),  # a percent is part of the value
    ("50%", "0.5"),
    ("(1, 2)", "[1, 2]"),  # different intervals
    ("(1, 2)", "(2, 1)"),
    ("(1, 2)", "(1, 2, 3)"),
    ("1/0", "0"),
    ("0.3333", "1/3"),  # exact: no rounding
    ("-3", "3"),
    ("5", "5\\sqrt{2}"),
    ("", ""),
    ("x", "y"),
]


@pytest.mark.parametrize(("a", "b"), EQUIVALENT)
def test_equivalent_forms_match_both_ways(a: str, b: str) -> None:
    assert answers_match(a, b) and answers_match(b, a)
    assert is_correct(f"so \\boxed{{{a}}}", b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_answers_do_not_match(a: str, b: str) -> None:
    assert not answers_match(a, b) and not answers_match(b, a)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("first \\boxed{1}, then \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{2} and an open \\boxed{3", "2"),  # an unbalanced box is no answer
        ("\\boxed{2} then \\boxed{ }", "2"),  # nor is an empty one
        ("#### 1,000\nThe answer is 7", "1,000"),  # a box, then ####, then "answer is"
        ("The answer is 7. Later 9 apples", "7"),
        ("The answer is 3.5.", "3.5"),
        ("Final answer: $\\frac12$.", "$\\frac12$"),
        ("The answer is 5%.", "5%"),
        ("the answer is 2x+1", "2x+1"),
        ("the answer isn't 4; we get 7", "7"),  # no "answer is": the last number
        ("5 - 3 = 2 and then 50%", "50%"),
        ("half is 1 / 2", "1 / 2"),
        ("−3 is it", "−3"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extraction_order(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_is_correct_extracts_from_a_worked_reference_and_wants_an_answer() -> None:
    assert is_correct("The answer is 72.", "She sold 48 + 24 = 72 clips.\n#### 72")
    assert is_correct("\\boxed{\\dfrac{3}{4}}", "\\boxed{0.75}")
    assert not is_correct("I do not know", "7")
    assert normalize(" $\\left( 1,\\, 2 \\right)$. ") == "(1,2)"


def settings(*overrides: str) -> RunConfig:
    return load_config(None, list(overrides))


def sample(response: str, finished: bool = True, answer: str = "42", *overrides: str) -> Sample:
    return Sample("What is 20 + 22?", response, answer, finished, settings(*overrides).rewards)


def test_math_format_and_length_rewards() -> None:
    load_modules([])
    math, fmt, length = get_reward("math"), get_reward("format"), get_reward("length")
    assert math(sample("so \\boxed{42}")) == 1.0 and math(sample("so \\boxed{41}")) == 0.0
    assert math(sample("so \\boxed{42}", False)) == 1.0  # correctness does not ask for an end
    assert fmt(sample("so \\boxed{42}")) == 1.0
    assert fmt(sample("so \\boxed{42}", False)) == 0.0
    assert fmt(sample("so 42")) == 0.0
    assert fmt(sample("so \\boxed{\n42\n}")) == 1.0
    assert (
        fmt(sample("<answer>42</answer>", True, "42", "rewards.format_pattern='<answer>.*</answer>'")) == 1.0
    )
    assert length(sample("x" * 500)) == 0.0  # off by default
    on = ("rewards.length_limit=10", "rewards.length_penalty=0.5")
    assert length(sample("x" * 14, True, "42", *on)) == pytest.approx(-2.0)
    assert length(sample("x" * 10, True, "42", *on)) == 0.0


def arithmetic_task() -> ArithmeticTask:
    return ArithmeticTask(TaskConfig(name="arithmetic", format_weight=0.2), seed=0)


async def test_scorer_without_weights_is_the_tasks_own_reward() -> None:
    scorer = make_scorer(settings(), arithmetic_task())
    score = await scorer.score("What is 20 + 22?", "42", "42", True)
    assert score.reward == 1.0 and score.correct == 1.0 and score.parts == {"task": 1.0}
    score = await scorer.score("What is 20 + 22?", "41", "42", True)
    assert score.reward == pytest.approx(0.2) and score.correct == 0.0 and score.parts == {"task": 0.2}


async def test_scorer_weighted_sum_with_parts() -> None:
    cfg = settings(
        "rewards.weights={math = 1.0, format = 0.2, length = 1.0}",
        "rewards.length_limit=10",
        "rewards.length_penalty=0.01",
    )
    scorer = make_scorer(cfg, arithmetic_task())
    response = "It is \\boxed{42}"  # 16 characters: 6 beyond the limit
    score = await scorer.score("What is 20 + 22?", response, "42", True)
    assert score.parts == {"math": 1.0, "format": 1.0, "length": pytest.approx(-0.06)}
    assert score.reward == pytest.approx(1.0 + 0.2 - 0.06)
    assert score.correct == 0.0  # the arithmetic task wants the bare number
    unfinished = await scorer.score("What is 20 + 22?", response, "42", False)
    assert unfinished.parts["format"] == 0.0 and unfinished.reward == pytest.approx(1.0 - 0.06)


@reward("test_async_half")
async def _async_half(sample: Sample) -> float:
    await asyncio.sleep(0)
    return 0.5 if sample.finished else 0.0


async def test_an_async_reward_function_is_awaited() -> None:
    scorer = make_scorer(settings("rewards.weights={test_async_half = 2.0, math = 1.0}"), arithmetic_task())
    score = await scorer.score("What is 20 + 22?", "42", "42", True)
    assert score.parts == {"test_async_half": 0.5, "math": 1.0}
    assert score.reward == pytest.approx(2.0) and score.correct == 1.0


async def test_a_user_module_registers_a_reward_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"user_rewards_{uuid.uuid4().hex}"
    name = f"shout_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from cadence.rewards.base import Sample, reward\n\n\n"
        f"@reward({name!r})\n"
        "def shout(sample: Sample) -> float:\n"
        "    return 1.0 if sample.response.isupper() else 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = settings(f"rewards.weights={{{name} = 0.5}}", f"rewards.modules=['{module}']")
    scorer = make_scorer(cfg, arithmetic_task())
    assert name in registered()
    score = await scorer.score("What is 20 + 22?", "FORTY-TWO", "42", True)
    assert score.parts == {name: 1.0} and score.reward == 0.5 and score.correct == 0.0


def test_unknown_names_and_modules_are_named() -> None:
    with pytest.raises(ConfigError, match=r"no reward function 'nope'; registered: .*format.*math"):
        make_scorer(settings("rewards.weights={math = 1.0, nope = 1.0}"), arithmetic_task())
    with pytest.raises(ImportError, match="no_such_reward_module"):
        make_scorer(
            settings("rewards.weights={math = 1.0}", "rewards.modules=['no_such_reward_module']"),
            arithmetic_task(),
        )
    with pytest.raises(KeyError, match="registered:"):
        get_reward("nope")


def _raises(sample: Sample) -> float:
    raise ZeroDivisionError("the user's bug")


def _not_finite(sample: Sample) -> float:
    return float("nan")


_HUNG = threading.Event()


def _hangs(sample: Sample) -> float:
    _HUNG.wait(30)  # released when the test ends
    return 1.0


def _loop_set(sample: Sample) -> float:
    """Returns 1 only once the event loop has run while this function waited."""
    return 1.0 if _LOOP_RAN.wait(10) else 0.0


_LOOP_RAN = threading.Event()
for _name, _fn in (
    ("test_raises", _raises),
    ("test_not_finite", _not_finite),
    ("test_hangs", _hangs),
    ("test_loop_set", _loop_set),
):
    reward(_name)(_fn)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("test_raises", "ZeroDivisionError: the user's bug"),
        ("test_not_finite", "returned nan, not a finite value"),
        ("test_hangs", "no value within rewards.timeout_s = 0.2s"),
    ],
)
async def test_a_failing_reward_function_is_named_and_gives_on_error(name: str, why: str) -> None:
    cfg = settings(
        f"rewards.weights={{{name} = 1.0, math = 2.0}}", "rewards.timeout_s=0.2", "rewards.on_error=-0.5"
    )
    scorer = make_scorer(cfg, arithmetic_task())
    try:
        with structlog.testing.capture_logs() as logs:
            score = await scorer.score("What is 20 + 22?", "42", "42", True, prompt_id=17)
    finally:
        _HUNG.set()
    _HUNG.clear()
    assert score.parts == {name: -0.5, "math": 1.0} and score.reward == pytest.approx(1.5)
    failed = [e for e in logs if e["event"] == "reward_function_failed"]
    assert len(failed) == 1
    assert failed[0]["function"] == name and failed[0]["prompt_id"] == 17 and failed[0]["why"] == why


async def test_a_sync_reward_function_runs_off_the_event_loop() -> None:
    scorer = make_scorer(settings("rewards.weights={test_loop_set = 1.0}"), arithmetic_task())
    _LOOP_RAN.clear()
    scoring = asyncio.create_task(scorer.score("What is 20 + 22?", "42", "42", True))
    await asyncio.sleep(0.05)  # the loop runs while the function waits: it is on another thread
    _LOOP_RAN.set()
    score = await asyncio.wait_for(scoring, 10)
    assert score.parts == {"test_loop_set": 1.0}


class _NanTask(ArithmeticTask):
    def score(self, prompt: str, response: str, answer: str, finished: bool) -> Score:
        return Score(reward=float("nan"), correct=1.0)


async def test_a_tasks_own_non_finite_reward_is_named_and_gives_on_error() -> None:
    scorer = make_scorer(settings("rewards.on_error=0.25"), _NanTask(TaskConfig(name="arithmetic"), seed=0))
    with structlog.testing.capture_logs() as logs:
        score = await scorer.score("What is 20 + 22?", "42", "42", True, prompt_id=3)
    assert score.reward == 0.25 and score.parts == {"task": 0.25} and score.correct == 1.0
    (failed,) = [e for e in logs if e["event"] == "reward_function_failed"]
    assert (failed["function"], failed["prompt_id"]) == ("task", 3) and "nan" in failed["why"]
