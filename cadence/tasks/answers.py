"""A math answer checker (the `math` reward and the math tasks' correctness): pull the final answer out of a response and compare it with the reference.

Extraction takes, in order: the last balanced ``\\boxed{...}``, the text after the last ``####``, the
text after the last "answer is" / "answer:", the last number in the text.

Comparison is exact (`fractions.Fraction`, never floats) on equivalent forms of one number:
``1,000`` = ``1\\,000`` = ``1{,}000`` = ``1000``; ``+5`` = ``5``; ``$5$`` = ``5``; ``5.`` = ``5``;
``-3`` = ``−3``; ``0.5`` = ``1/2`` = ``\\frac{1}{2}`` = ``\\dfrac12`` = ``\\tfrac{1}{2}``; ``2.50`` = ``5/2``;
``10\\text{ cm}`` = ``10``; ``30^\\circ`` = ``30``; ``x = 5`` = ``5``. Tuples and lists compare
elementwise, ``\\left( ... \\right)`` as parentheses. Anything else falls back to string equality
after normalising (case, whitespace, ``$``, a trailing period).

Decisions on ambiguous forms:
- ``1,000`` is one thousand only as a bare number grouped in threes; ``1.000`` is the decimal one, so
  the two differ. Inside brackets commas separate elements: ``(1,000)`` is the pair (1, 0).
  A bare ``1,2`` or ``1, 2`` is the pair (1, 2).
- A percent is part of the value: ``50%`` = ``50\\%`` = ``50.0%``, but ``50%`` is neither ``50``
  nor ``0.5``.
- Parentheses and square brackets differ (intervals): ``(1, 2)`` != ``[1, 2]``; a bare ``1, 2``
  equals both; a single bracketed number equals the number: ``(5)`` = ``5``.
- Spaces between digits are kept, so ``1 000`` is not a number and ``1 1/2`` is not ``11/2``; a
  number never equals a text that is not one.
- ``\\text{...}`` after something else (units) is dropped; a text alone is unwrapped:
  ``\\text{(B)}`` = ``(B)``.
- A reference that itself holds ``\\boxed{}`` or ``####`` (a worked solution) is reduced by the same
  extraction first.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is\b|:)\s*:?\s*([^\n]*)", re.IGNORECASE)
_NUMBER = r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+−]?\.\d+"
_NUMBERS = re.compile(rf"(?:{_NUMBER})(?:\s*\\?%)?")
_LEADING_NUMBER = re.compile(rf"(?:{_NUMBER})(?![\w,/^\\%]|\.\d)(?!\s*[-+*/=^×÷%\\])")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm)\s*\{")
_DROPPED = re.compile(
    r"\\(?:left|right|displaystyle)(?![a-z])|\\[!,;: ]|\^\s*\{?\\circ\}?|°|~|\\\$|\$", re.IGNORECASE
)
_SPACE_BETWEEN_DIGITS = re.compile(r"(?<=\d)\s+(?=\d)")
_ASSIGNMENT = re.compile(r"^[a-z]=(?!=)")
_PLAIN = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+")
_FRAC = re.compile(r"\\frac(\{[^{}]*\}|\d)\s?(\{[^{}]*\}|\d)")
_PAIRS = {"(": ")", "[": "]"}

Value = tuple[Fraction, bool]  # the number, and whether it is a percent


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at text[start] and the index after it; None if open."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def extract_answer(response: str) -> str | None:
    """The final answer a response states, or None when it states none (see the module docstring)."""
    boxed = None
    for match in _BOXED.finditer(response):
        group = _braced(response, match.end() - 1)
        if group is not None and group[0].strip():
            boxed = group[0].strip()
    if boxed is not None:
        return boxed
    for pattern in (_HASHES, _ANSWER_IS):
        found = list(pattern.finditer(response))
        if found:
            text = found[-1].group(1).strip()
            number = _LEADING_NUMBER.match(text)
            if number:
                return number.group(0)
            text = re.split(r"\.\s", text)[0].rstrip(". ")
            if text:
                return text
    numbers = _NUMBERS.findall(response)
    return numbers[-1] if numbers else None


def _strip_text_commands(text: str) -> str:
    """Drop `\\text{...}` groups that follow or precede something else (units); unwrap them if alone."""
    dropped, unwrapped, pos = [], [], 0
    for match in _TEXT_COMMAND.finditer(text):
        if match.start() < pos:
            continue
        group = _braced(text, match.end() - 1)
        if group is None:
            break
        dropped.append(text[pos : match.start()])
        unwrapped.extend([text[pos : match.start()], group[0]])
        pos = group[1]
    dropped.append(text[pos:])
    unwrapped.append(text[pos:])
    rest = "".join(dropped)
    return rest if rest.strip() else "".join(unwrapped)


def normalize(text: str) -> str:
    """A canonical spelling of an answer: lower case, no `$`, spacing, `\\left`, units or final period."""
    text = _strip_text_commands(text.strip())
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    text = _DROPPED.sub("", text).replace("{,}", ",").replace("−", "-").lower()
    text = _SPACE_BETWEEN_DIGITS.sub(" ", text.strip())
    text = re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", text)
    text = text.rstrip(".")
    return _ASSIGNMENT.sub("", text)


def _plain(text: str) -> Fraction | None:
    sign = -1 if text.startswith("-") else 1
    text = text[1:] if text[:1] in "+-" else text
    if not _PLAIN.fullmatch(text):
        return None
    return sign * Fraction(text.replace(",", ""))


def _number(text: str) -> Value | None:
    """The exact value of one normalised number (integer, decimal, a/b, \\frac), or None."""
    percent = text.endswith("%")
    text = text.removesuffix("%")
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in "+-" else text
    if (frac := _FRAC.fullmatch(body)) is not None:
        num, den = (_plain(part.strip("{}")) for part in frac.groups())
    elif body.count("/") == 1:
        num, den = (_plain(part) for part in body.split("/"))
    else:
        value = _plain(body)
        return None if value is None else (sign * value, percent)
    if num is None or den is None or den == 0:
        return None
    return sign * num / den, percent


def _elements(text: str) -> tuple[str, list[str]] | None:
    """A tuple or list split at its top-level commas, with its bracket ("" when bare); else None."""
    bracket = ""
    if text[:1] in _PAIRS and text.endswith(_PAIRS[text[0]]):
        depth = 0
        for i, char in enumerate(text):
            depth += char in "([{"
            depth -= char in ")]}"
            if depth == 0 and i < len(text) - 1:
                break
        else:
            bracket, text = text[0], text[1:-1]
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    if len(parts) == 1 and not bracket:
        return None
    return bracket, parts


def _unwrap(text: str) -> str:
    """A single bracketed element without its brackets: `(5)` is `5`."""
    elements = _elements(text)
    if elements is not None and elements[0] and len(elements[1]) == 1:
        return elements[1][0]
    return text


def _same(a: str, b: str) -> bool:
    a, b = _unwrap(a), _unwrap(b)
    if a == b:
        return bool(a)
    va, vb = _number(a), _number(b)
    if va is not None or vb is not None:
        return va == vb
    ea, eb = _elements(a), _elements(b)
    if ea is None or eb is None:
        return False
    (bracket_a, parts_a), (bracket_b, parts_b) = ea, eb
    if bracket_a and bracket_b and bracket_a != bracket_b:
        return False
    return len(parts_a) == len(parts_b) and all(_same(x, y) for x, y in zip(parts_a, parts_b, strict=True))


def answers_match(given: str, reference: str) -> bool:
    """Whether two final answers are equivalent (see the module docstring)."""
    return _same(normalize(given), normalize(reference))


def is_correct(response: str, answer: str) -> bool:
    """Whether the final answer of `response` is equivalent to the reference `answer`."""
    given = extract_answer(response)
    if given is None:
        return False
    if _BOXED.search(answer) or "####" in answer:
        answer = extract_answer(answer) or answer
    return answers_match(given, answer)
