"""The calculator's parser: exact against Python's own arithmetic, and refusing hostile input quickly
with a message that says why."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.tasks.environments.calc import (
    MAX_CHARS,
    MAX_DEPTH,
    MAX_DIGITS,
    CalcError,
    calculate,
    evaluate,
    show,
)

pytestmark = pytest.mark.timeout(60)

_numbers = st.integers(min_value=0, max_value=999).map(str)


@st.composite
def flat(draw: st.DrawFn) -> str:
    """An expression of + - * over small integers, signs and spaces, without parentheses: Python's
    grammar gives it the same precedence and associativity."""
    parts = [draw(st.sampled_from(["", "-", "- "])) + draw(_numbers)]
    for _ in range(draw(st.integers(0, 8))):
        parts += [draw(st.sampled_from(["+", "-", "*", " + ", " * "])), draw(_numbers)]
    return "".join(parts)


def _tree(depth: int) -> st.SearchStrategy[tuple[str, Fraction]]:
    """A fully parenthesised expression with `/` and its exact value."""
    leaf = st.integers(-50, 50).map(lambda n: (f"({n})" if n < 0 else str(n), Fraction(n)))
    if depth == 0:
        return leaf
    sub = _tree(depth - 1)
    ops = st.sampled_from("+-*/")
    return st.one_of(leaf, st.tuples(sub, ops, sub).filter(lambda t: t[1] != "/" or t[2][1] != 0).map(_join))


def _join(t: tuple[tuple[str, Fraction], str, tuple[str, Fraction]]) -> tuple[str, Fraction]:
    (left, a), op, (right, b) = t
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
    return f"({left}{op}{right})", value


@given(flat())
@settings(max_examples=300, deadline=None)
def test_flat_expressions_equal_python_integer_arithmetic(text: str) -> None:
    # the oracle is Python's own grammar on an expression of digits, signs and + - * only
    assert evaluate(text) == eval(text, {"__builtins__": {}})  # noqa: S307


@given(_tree(3))
@settings(max_examples=300, deadline=None)
def test_nested_expressions_with_division_are_exact(case: tuple[str, Fraction]) -> None:
    text, value = case
    assert evaluate(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [("12*(3+4)", "84"), ("7/2", "3.5"), ("1/3", "1/3"), ("-1/8", "-0.125"), ("2-3*4", "-10"),
     ("--3", "3"), ("+5", "5"), (" ( 1 + 2 ) * 3 ", "9"), ("8/2/2", "2"), ("10-2-3", "5")],
)  # fmt: skip
def test_known_values(text: str, value: str) -> None:
    assert calculate(text) == value


def test_show_writes_integers_decimals_and_fractions() -> None:
    assert show(Fraction(3)) == "3" and show(Fraction(-7, 4)) == "-1.75" and show(Fraction(2, 7)) == "2/7"
    assert show(Fraction(1, 1000)) == "0.001"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1/0", "division by zero"),
        ("5/(3-3)", "division by zero"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("2**10", "powers are not supported"),
        ("2^10", "powers are not supported"),
        ("1+", "expected a number at position 2, found the end"),
        ("(1+2", "missing ')' at position 4"),
        ("1+2)", "unexpected ')' at position 3"),
        ("abs(3)", "expected a number at position 0, found 'a'"),
        ("__import__('os')", "expected a number at position 0, found '_'"),
        ("1.5+1", "unexpected '.' at position 1"),
        ("²+1", "expected a number at position 0, found '²'"),
        ("9" * (MAX_DIGITS + 1), f"longer than {MAX_DIGITS} digits at position 0"),
        ("1+" * 200, f"longer than {MAX_CHARS} characters"),
    ],
)
def test_refusals_say_why(text: str, why: str) -> None:
    with pytest.raises(CalcError, match=why.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        evaluate(text)
    assert calculate(text).startswith("error: ")


def test_hostile_inputs_are_refused_quickly() -> None:
    big = "9" * MAX_DIGITS
    hostile = [
        "(" * 120 + "1" + ")" * 120,  # nesting
        "-" * 200 + "1",  # a chain of signs nests as deep
        "*".join([big] * 8),  # a product past the value bound
        "/".join(["1"] + [big] * 8),  # a denominator past it
        "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1),
        "1" * 10_000_000,  # refused by its length before anything is read
    ]
    for text in hostile:
        started = time.perf_counter()
        answer = calculate(text)
        assert answer.startswith("error: "), (text[:40], answer)
        assert time.perf_counter() - started < 0.5
    assert "nesting deeper than" in calculate("(" * 40 + "1" + ")" * 40)
    assert "a value beyond 10^100" in calculate("*".join([big] * 8))


def test_the_deepest_allowed_nesting_is_computed() -> None:
    depth = MAX_DEPTH - 1
    assert calculate("(" * depth + "2" + ")" * depth) == "2"
