"""An example with two tools: a lookup table of facts and a unit converter. The question (drawn from
the prompt's id and text, like guess-the-number's game, so a group plays one problem) asks for a
fact in a unit the table does not give it in: the model looks it up, converts it, and answers.

```
 user: How long is the Danube in miles? Answer with a whole number.
 model: <tool_call>{"name": "lookup", "arguments": {"item": "Danube"}}</tool_call>
 tool:  {"item": "Danube", "length": 2850, "unit": "km"}
 model: <tool_call>{"name": "convert", "arguments": {"value": 2850, "from_unit": "km", "to_unit": "mi"}}</tool_call>
 tool:  1770.907
 model: 1771
```

The score: 1 when the answer's last number is within 1 of the exact conversion, else 0.

Invariant: deterministic; the tools read only the module's tables.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from cadence.tasks.base import Prompt
from cadence.tasks.environments.base import Environment
from cadence.tasks.tools.environment import Example, ToolEnvironment
from cadence.tasks.tools.toolbox import Toolbox, ToolError

Unit = Literal["m", "km", "ft", "mi"]
METRES = {"m": 1.0, "km": 1000.0, "ft": 0.3048, "mi": 1609.344}
FACTS = {  # item: (what, value, unit)
    "Mont Blanc": ("height", 4806, "m"),
    "Kilimanjaro": ("height", 5895, "m"),
    "Denali": ("height", 6190, "m"),
    "Aconcagua": ("height", 6961, "m"),
    "Danube": ("length", 2850, "km"),
    "Rhine": ("length", 1233, "km"),
    "Thames": ("length", 346, "km"),
    "Loire": ("length", 1006, "km"),
}
ASK = {"m": "in feet", "km": "in miles"}
TARGET: dict[str, Unit] = {"m": "ft", "km": "mi"}
INSTRUCTIONS = (
    "You have two tools: lookup gives a fact about a mountain or a river, convert converts between"
    " units. Use them, then reply with the answer alone, as a whole number, and no tool call."
)
EXAMPLE = Example(
    "How long is the Seine in miles? Answer with a whole number.",
    (
        ("lookup", {"item": "Seine"}, '{"item": "Seine", "length": 777, "unit": "km"}'),
        ("convert", {"value": 777, "from_unit": "km", "to_unit": "mi"}, "482.8"),
    ),
    "483",
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def lookup(item: str) -> dict[str, object]:
    """Look up the height of a mountain or the length of a river.

    Args:
        item: the mountain or river, such as "Mont Blanc" or "Danube"
    """
    found = next((key for key in FACTS if key.lower() == item.strip().lower()), None)
    if found is None:
        raise ToolError(f"no entry for {item!r}; the table has: {', '.join(FACTS)}")
    what, value, unit = FACTS[found]
    return {"item": found, what: value, "unit": unit}


def convert(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a distance from one unit to another.

    Args:
        value: the distance
        from_unit: the unit it is given in
        to_unit: the unit wanted
    """
    return round(value * METRES[from_unit] / METRES[to_unit], 3)


TOOLBOX = Toolbox([lookup, convert], max_calls=4)


def _problem(prompt: Prompt) -> tuple[str, float]:
    rng = random.Random(f"units/{prompt.prompt_id}/{prompt.text}")
    item = rng.choice(sorted(FACTS))
    what, value, unit = FACTS[item]
    question = (
        f"How {'tall' if what == 'height' else 'long'} is {item} {ASK[unit]}? Answer with a whole number."
    )
    return question, convert(value, unit, TARGET[unit])  # type: ignore[arg-type]


def within_one(answer: str, prompt: Prompt) -> float:
    numbers = _NUMBER.findall(answer.replace(",", ""))
    return float(bool(numbers) and abs(float(numbers[-1]) - float(prompt.answer)) <= 1.0)


def Units(prompt: Prompt, seed: int) -> Environment:  # noqa: N802 (a factory named as the environment)
    """The factory: environment.name = "units"."""
    question, exact = _problem(prompt)
    asked = Prompt(prompt.prompt_id, question, str(exact))
    env = ToolEnvironment(asked, TOOLBOX, INSTRUCTIONS, EXAMPLE, within_one)
    env.name = "units"
    return env
