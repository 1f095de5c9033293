"""A calculator that is safe by construction: integers, `+ - * /`, parentheses and signs, exact.

No Python is evaluated: a recursive-descent parser over this grammar computes with `Fraction`s.

```
 expression := term (("+" | "-") term)*
 term       := factor (("*" | "/") factor)*
 factor     := ("+" | "-") factor | "(" expression ")" | digits
```

Bounds, so a call cannot hang: at most `MAX_CHARS` characters, `MAX_DIGITS` digits a number,
`MAX_DEPTH` nested parentheses and signs, and every value on the way below 10**`MAX_VALUE_DIGITS`
(numerator and denominator); no powers. The work is then linear in the length, on numbers of bounded
size: well under a millisecond.

Invariant: `evaluate` returns the exact value or raises `CalcError` saying what is wrong and, for the
text, where (0-based position); `calculate` never raises.
"""

from __future__ import annotations

from fractions import Fraction

MAX_CHARS = 256
MAX_DIGITS = 30
MAX_DEPTH = 32
MAX_VALUE_DIGITS = 100
_LIMIT = 10**MAX_VALUE_DIGITS
_DIGITS = frozenset("0123456789")  # ASCII only: "²".isdigit() is True
_SPACE = frozenset(" \t\r\n")


class CalcError(ValueError):
    """An expression the calculator refuses: its message says why."""


def evaluate(text: str) -> Fraction:
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    if "^" in text or "**" in text:
        raise CalcError("powers are not supported: write the product")
    return _Parser(text).parse()


def show(value: Fraction) -> str:
    """An integer as itself, a terminating fraction as a decimal (`3.5`), any other as `p/q`."""
    sign = "-" if value < 0 else ""
    numerator, denominator = abs(value.numerator), value.denominator
    if denominator == 1:
        return f"{sign}{numerator}"
    twos = fives = 0
    rest = denominator
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return f"{sign}{numerator}/{denominator}"
    places = max(twos, fives)
    digits = str(numerator * 10**places // denominator).rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def calculate(text: str) -> str:
    """The value of `text` as `show` writes it, or `error: <why>`."""
    try:
        return show(evaluate(text))
    except CalcError as exc:
        return f"error: {exc}"


def _bounded(value: Fraction) -> Fraction:
    if abs(value.numerator) >= _LIMIT or value.denominator >= _LIMIT:
        raise CalcError(f"a value beyond 10^{MAX_VALUE_DIGITS}")
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    def parse(self) -> Fraction:
        if not self.peek():
            raise CalcError("empty expression")
        value = self.expression()
        if self.peek():
            raise CalcError(f"unexpected {self.text[self.pos]!r} at position {self.pos}")
        return value

    def peek(self) -> str:
        """The next character that is not a space ("" at the end)."""
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expression(self) -> Fraction:
        value = self.term()
        while (op := self.peek()) in ("+", "-"):
            self.pos += 1
            right = self.term()
            value = _bounded(value + right if op == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while (op := self.peek()) in ("*", "/"):
            self.pos += 1
            right = self.factor()
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = _bounded(value * right if op == "*" else value / right)
        return value

    def factor(self) -> Fraction:
        if self.depth >= MAX_DEPTH:
            raise CalcError(f"nesting deeper than {MAX_DEPTH} at position {self.pos}")
        self.depth += 1
        try:
            char = self.peek()
            if char in ("+", "-"):
                self.pos += 1
                value = self.factor()
                return -value if char == "-" else value
            if char == "(":
                self.pos += 1
                value = self.expression()
                if self.peek() != ")":
                    raise CalcError(f"missing ')' at position {self.pos}")
                self.pos += 1
                return value
            return self.number()
        finally:
            self.depth -= 1

    def number(self) -> Fraction:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _DIGITS:
            self.pos += 1
        if self.pos == start:
            found = repr(self.text[start]) if start < len(self.text) else "the end"
            raise CalcError(f"expected a number at position {start}, found {found}")
        if self.pos - start > MAX_DIGITS:
            raise CalcError(f"a number longer than {MAX_DIGITS} digits at position {start}")
        return Fraction(int(self.text[start : self.pos]))
