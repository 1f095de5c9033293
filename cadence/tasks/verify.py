"""math-verify (Hugging Face's math answer checker, an optional extra: `pip install 'cadence[math]'`)
as a checker beside cadence's own (`answers.py`): `task.checker = "math_verify"` or the
`math_verify` reward.

math-verify parses the reference and the response into SymPy (LaTeX and plain expressions, the last
`\\boxed{}` first) and compares them symbolically; cadence's checker extracts one final answer and
compares exact numbers. Where they differ is measured in docs/tasks.md.

Invariant: `math_verify_correct` never raises for a response (a parse or comparison that fails is
not correct); the package missing raises `ImportError` saying how to install it. Its own signal-based
timeouts work only on a process's main thread, so they are used there alone (elsewhere a comparison
is not bounded by math-verify: the reward's own `rewards.timeout_s` bounds it).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cadence.tasks.answers import is_correct

INSTALL = "math-verify is not installed: pip install 'cadence[math]' (or math-verify==0.9.0)"


def available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def math_verify_correct(response: str, answer: str) -> bool:
    """Whether math-verify finds `response`'s answer equivalent to the reference `answer`."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ImportError(INSTALL) from None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its warning on every call off the main thread
    main = threading.current_thread() is threading.main_thread()
    limits: dict[str, Any] = {} if main else {"parsing_timeout": None}
    try:
        gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", **limits)
        given = parse(response, **limits)
        return bool(verify(gold, given, **({} if main else {"timeout_seconds": None})))
    except Exception:  # a checker that fails on a malformed answer: not correct
        return False


def check_answer(response: str, answer: str, checker: str = "cadence") -> bool:
    """Whether `response` answers `answer`, judged by `checker` ("cadence" or "math_verify")."""
    if checker == "math_verify":
        return math_verify_correct(response, answer)
    return is_correct(response, answer)
