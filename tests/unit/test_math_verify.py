"""math-verify as a reward and as the file task's checker (an optional extra), beside cadence's own."""

from __future__ import annotations

import importlib.util

import pytest

from cadence.config import ConfigError, load_config
from cadence.config.checks import math_verify_is_installed
from cadence.rewards.base import get_reward, load_modules
from cadence.tasks.verify import check_answer

needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None,
    reason="math-verify is an optional extra: pip install 'cadence[math]'",
)


@needs_math_verify
@pytest.mark.parametrize(
    ("response", "answer", "ours", "theirs"),
    [
        ("The answer is 84.", "84", True, True),
        ("\\boxed{\\frac{1}{2}}", "0.5", True, True),
        ("85", "84", False, False),
        ("x = 84", "84", True, True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", False, True),  # symbolic: only math-verify
        ("50%", "0.5", False, True),  # a percent is its value to math-verify, a percent to cadence
        ("\\boxed{2\\sqrt{2}}", "2\\sqrt{2}", True, True),
        ("#### 84", "84", True, True),
    ],
)
def test_both_checkers_judge_answers(response: str, answer: str, ours: bool, theirs: bool) -> None:
    assert check_answer(response, answer, "cadence") is ours
    assert check_answer(response, answer, "math_verify") is theirs


@needs_math_verify
def test_math_verify_is_a_registered_reward_and_works_off_the_main_thread() -> None:
    import threading

    from cadence.rewards.base import Sample

    load_modules([])
    sample = Sample("q", "So \\boxed{84}.", "84", True, load_config(None, []).rewards)
    got: list[float] = []
    thread = threading.Thread(target=lambda: got.append(get_reward("math_verify")(sample)))  # type: ignore[arg-type]
    thread.start()
    thread.join(60)
    assert got == [1.0]


def test_asking_for_math_verify_without_it_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, ["task.name='file'"])
    cfg = type(cfg)(
        **{**cfg.__dict__, "task": type(cfg.task)(**{**cfg.task.__dict__, "checker": "math_verify"})}
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"task.checker asks for math-verify, which is not installed"):
        math_verify_is_installed(cfg)
    math_verify_is_installed(load_config(None, []))  # not asked: fine
