"""How often cadence's math checker (`tasks/answers.py`) and math-verify (`tasks/verify.py`) agree,
on the responses of runs (their `samples/*.jsonl`) and on each problem's answer written in the forms
a model writes it (right and wrong), as docs/tasks.md reports.

    python -m cadence.bench.checkers --runs RUN_DIR... --data FILE.jsonl...

Invariant: every pair is judged by both checkers; the figures are counts, and each kind of
disagreement keeps its first examples.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cadence.tasks.answers import is_correct
from cadence.tasks.verify import math_verify_correct

_INTEGER = re.compile(r"-?\d+")
_FRACTION = re.compile(r"(-?\d+)/(\d+)")
_DECIMAL = re.compile(r"-?\d+\.\d+")


def forms(answer: str) -> list[tuple[str, str, bool | None]]:
    """(the form's name, a response in it, whether it is right) for a reference `answer`."""
    out: list[tuple[str, str, bool | None]] = [
        ("plain", answer, True),
        ("sentence", f"The answer is {answer}.", True),
        ("boxed", f"So the result is \\boxed{{{answer}}}.", True),
        ("hashes", f"#### {answer}", True),
        ("dollars", f"${answer}$", True),
        ("equation", f"x = {answer}", True),
        ("reasoning", f"First 2 + 2 = 4, then the rest: {answer}", True),
    ]
    if _INTEGER.fullmatch(answer):
        value = int(answer)
        out += [
            ("decimal", f"{value}.0", True),
            ("wrong", str(value + 1), False),
            ("wrong_boxed", f"\\boxed{{{value - 1}}}", False),
            ("negated", str(-value), value == 0),
        ]
        if abs(value) >= 1000:
            out.append(("grouped", f"{value:,}", True))
    if fraction := _FRACTION.fullmatch(answer):
        top, bottom = int(fraction.group(1)), int(fraction.group(2))
        out += [
            ("latex_fraction", f"\\boxed{{\\frac{{{top}}}{{{bottom}}}}}", True),
            ("unsimplified", f"{2 * top}/{2 * bottom}", None),  # its value, not in lowest terms
            ("decimal_of", f"{top / bottom:.4f}", None),  # rounded
            ("wrong", f"{top + 1}/{bottom}", False),
        ]
    if _DECIMAL.fullmatch(answer):
        out += [("trailing_zero", f"{answer}0", True), ("wrong", f"{float(answer) + 1}", False)]
    out.append(("none", "I do not know.", False))
    return out


Pair = tuple[str, str, str, bool | None]  # kind, response, answer, whether it is right (None: unknown)


def compare(pairs: Iterable[Pair], examples: int = 3) -> dict[str, Any]:
    """For (kind, response, answer, right) pairs: how many each checker accepts (and judges as the
    form is, where that is known), where they agree, and the first examples of each disagreement."""
    counts: Counter[str] = Counter()
    differ: dict[str, list[dict[str, str]]] = {}
    for kind, response, answer, right in pairs:
        ours, theirs = is_correct(response, answer), math_verify_correct(response, answer)
        counts["pairs"] += 1
        counts["cadence"] += ours
        counts["math_verify"] += theirs
        if right is not None:
            counts["cadence_wrong"] += ours != right
            counts["math_verify_wrong"] += theirs != right
        if ours != theirs:
            which = "cadence_only" if ours else "math_verify_only"
            counts[which] += 1
            found = differ.setdefault(f"{which}/{kind}", [])
            if len(found) < examples:
                found.append({"response": response[-160:], "answer": answer})
    n = counts["pairs"] or 1
    return {
        **counts,
        "agreement": round(1 - (counts["cadence_only"] + counts["math_verify_only"]) / n, 4),
        "differ": differ,
    }


def sample_pairs(run: Path) -> list[Pair]:
    """Every response of a run's samples files with its reference answer."""
    pairs: list[Pair] = []
    for path in sorted((run / "samples").glob("period-*.jsonl")):
        for line in path.read_text().splitlines():
            group = json.loads(line)
            pairs += [("sample", r["text"], str(group["answer"]), None) for r in group["responses"]]
    return pairs


def form_pairs(data: Path) -> list[Pair]:
    records = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    return [
        (kind, text, str(r["answer"]), right)
        for r in records
        for kind, text, right in forms(str(r["answer"]))
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="*", default=[])
    parser.add_argument("--data", type=Path, nargs="*", default=[])
    args = parser.parse_args(argv)
    for run in args.runs:
        print(json.dumps({"run": str(run), **compare(sample_pairs(run))}))
    for data in args.data:
        print(json.dumps({"data": str(data), **compare(form_pairs(data))}))


if __name__ == "__main__":
    main()
