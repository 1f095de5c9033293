"""A configuration key as declared on its field: its default, its description and the values it allows.

Invariant: a key's range is declared once, on its field (`doc(default, text, Rule(...))`), and read from
there by both the check (`check_fields`) and the generated reference (`docs/config.md`); a value out of
range raises `ConfigError` naming the full dotted key, what is allowed and the value given.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key."""


@dataclass(frozen=True)
class Rule:
    """The values a number may take beyond its type: bounds (`gt`, `ge`, `lt`, `le`) and finiteness.
    `note` follows the bound in parentheses (what a boundary value means, "0: automatic"); `why`
    follows the value refused (what a value out of range would do). NaN is inside no bound."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    finite: bool = False
    note: str = ""
    why: str = ""

    def allows(self, value: float) -> bool:
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
            and (not self.finite or math.isfinite(value))
        )

    def text(self) -> str:
        """What is allowed: "positive", ">= 1", "in [0, 1)", "finite and positive"."""
        low = self.gt if self.gt is not None else self.ge
        high = self.lt if self.lt is not None else self.le
        if low is not None and high is not None:
            left, right = "(" if self.gt is not None else "[", ")" if self.lt is not None else "]"
            bound = f"in {left}{low}, {high}{right}"
        elif self.gt == 0:
            bound = "positive"
        elif low is not None:
            bound = f"{'>' if self.gt is not None else '>='} {low}"
        elif high is not None:
            bound = f"{'<' if self.lt is not None else '<='} {high}"
        else:
            bound = ""
        if self.finite:
            return f"finite and {bound}" if bound else "finite"
        return bound

    def described(self) -> str:
        """The allowed values with their note, as the reference shows them."""
        return f"{self.text()} ({self.note})" if self.note else self.text()

    def refusal(self, key: str, value: Any) -> str:
        why = f": {self.why}" if self.why else ""
        return f"{key} must be {self.described()}, got {value}{why}"


POSITIVE = Rule(gt=0)
NOT_NEGATIVE = Rule(ge=0)
SHARE = Rule(ge=0, le=1)
AUTOMATIC_THREADS = Rule(ge=0, note="0: automatic")


def doc(default: Any, text: str, *rules: Rule) -> Any:
    """A field with its default, its description and its rules (checked in order; most keys have one
    or none). A list or table default is copied per instance."""
    metadata = {"doc": text, "rules": rules}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type[Any], text: str) -> Any:
    """A field holding a section (a `[table]` of the TOML file), its defaults those of `cls`."""
    return field(default_factory=cls, metadata={"doc": text})


def rules_of(f: dataclasses.Field[Any]) -> tuple[Rule, ...]:
    rules: tuple[Rule, ...] = f.metadata.get("rules", ())
    return rules


def check_fields(cfg: Any, prefix: str = "") -> None:
    """Every field's rules over a built configuration, sections depth first, in declaration order."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, f"{prefix}{f.name}.")
            continue
        for rule in rules_of(f):
            if not rule.allows(value):
                raise ConfigError(rule.refusal(prefix + f.name, value))
