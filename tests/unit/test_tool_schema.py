"""Tools from typed, documented Python functions: their OpenAI-format schemas, and the check of a
call's arguments against them."""

from __future__ import annotations

import enum
from typing import Literal

import pytest

from cadence.tasks.tools.schema import argument_problem, tool


def convert(value: float, unit: Literal["km", "mi"], digits: int = 2, note: str | None = None) -> str:
    """Convert a distance to metres.

    The second paragraph of the description.

    Args:
        value: the distance
        unit: the unit it is given in,
            on two lines
        digits: how many digits to keep

    Returns:
        the distance in metres
    """
    return f"{value} {unit}"


def tag(names: list[str], weights: dict[str, float]) -> str:
    """Tag things.

    :param names: what to tag
    :param weights: how much each weighs
    """
    return ""


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def paint(colour: Colour, flags: tuple[bool, ...] = ()) -> None:
    """Paint."""


def test_a_google_docstring_and_the_signature_make_the_openai_schema() -> None:
    schema = tool(convert).schema()
    assert schema == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a distance to metres. The second paragraph of the description.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number", "description": "the distance"},
                    "unit": {
                        "type": "string",
                        "enum": ["km", "mi"],
                        "description": "the unit it is given in, on two lines",
                    },
                    "digits": {"type": "integer", "description": "how many digits to keep"},
                    "note": {"type": "string", "nullable": True},
                },
                "required": ["value", "unit"],
            },
        },
    }


def test_rest_docstrings_arrays_objects_and_enums() -> None:
    made = tool(tag)
    assert made.description == "Tag things."
    assert made.parameters["properties"] == {
        "names": {"type": "array", "items": {"type": "string"}, "description": "what to tag"},
        "weights": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "how much each weighs",
        },
    }
    painted = tool(paint).parameters["properties"]
    assert painted["colour"] == {"type": "string", "enum": ["red", "blue"]}
    assert painted["flags"] == {"type": "array", "items": {"type": "boolean"}}
    assert tool(paint, name="brush", description="Brush.").schema()["function"]["name"] == "brush"


def test_async_tools_are_known_as_such() -> None:
    async def fetch(url: str) -> str:
        """Fetch."""
        return url

    assert tool(fetch).is_async and not tool(convert).is_async


def untyped(x) -> int:  # type: ignore[no-untyped-def]
    return 1


def opaque(x: object) -> int:
    return 1


def star(*xs: int) -> int:
    return 1


@pytest.mark.parametrize(
    ("function", "said"),
    [
        (untyped, "tool 'untyped': parameter 'x' has no type annotation"),
        (opaque, "tool 'opaque': parameter 'x' has type"),
        (star, "tool 'star': parameter 'xs' must be a plain keyword parameter"),
        (lambda x: x, "tool name '<lambda>'"),
    ],
)
def test_what_a_schema_cannot_say_is_refused_when_the_tool_is_made(function: object, said: str) -> None:
    with pytest.raises(TypeError, match=said.replace("(", r"\(").replace(")", r"\)")):
        tool(function)  # type: ignore[arg-type]


PARAMETERS = tool(convert).parameters


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"value": 3, "unit": "km"}, None),  # an integer is a number
        ({"value": 3.5, "unit": "mi", "digits": 1, "note": None}, None),
        ({"value": "3", "unit": "km"}, "argument 'value' must be a number, got string '3'"),
        ({"value": True, "unit": "km"}, "argument 'value' must be a number, got boolean True"),
        ({"value": 3, "unit": "km", "digits": 1.5}, "argument 'digits' must be an integer, got number 1.5"),
        ({"value": 3, "unit": "yd"}, "argument 'unit' must be one of 'km', 'mi', got 'yd'"),
        ({"value": 3}, "missing argument 'unit'"),
        ({"value": 3, "unit": "km", "speed": 2}, "unknown argument 'speed': the arguments are value, unit"),
        ({"value": 3, "unit": "km", "note": 7}, "argument 'note' must be a string, got integer 7"),
    ],
)
def test_arguments_are_checked_against_the_schema(arguments: dict[str, object], problem: str | None) -> None:
    found = argument_problem(PARAMETERS, arguments)
    assert found == problem if problem is None else (found is not None and found.startswith(problem))


def test_array_items_and_object_values_are_checked_where_they_are() -> None:
    parameters = tool(tag).parameters
    assert argument_problem(parameters, {"names": ["a", 2], "weights": {}}) == (
        "argument 'names'[1] must be a string, got integer 2"
    )
    assert argument_problem(parameters, {"names": [], "weights": {"a": "heavy"}}) == (
        "argument 'weights'['a'] must be a number, got string 'heavy'"
    )
    huge = "x" * 10_000
    assert argument_problem(parameters, {"names": huge, "weights": {}}) == (
        f"argument 'names' must be an array, got string {repr(huge)[:37]}..."
    )
