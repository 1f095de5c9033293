"""A typed, documented Python function as a tool: its OpenAI-format JSON schema (name, description,
parameters from the signature and the docstring) and the check of a call's arguments against it.

```
 def convert(value: float, unit: Literal["km", "mi"] = "km") -> float:
     '''Convert a distance.                          ─► description

     Args:
         value: the distance to convert              ─► parameters.properties.value.description
         unit: the unit it is given in
     '''
```

Types a schema can say: `int` (integer), `float` (number), `str`, `bool`, `Literal[...]` and `Enum`s
(enum), `list[X]`/`tuple[X, ...]` (array), `dict[str, X]` (object), `X | None` (X, and null allowed).
A parameter with a default is optional. Google-style (`Args:`) and reST (`:param x:`) docstrings are read.

Invariant: a function whose signature a schema cannot say raises `TypeError` naming the function and
the parameter when the `Tool` is made, never when the model calls it; `argument_problem` accepts
exactly what the schema allows (a bool is no integer, an integer is a number).
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

Schema = dict[str, Any]

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_ARG = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """One tool the model may call: its name, what it does, its parameters' JSON schema, and the
    function (sync or async) that runs it."""

    name: str
    description: str
    parameters: Schema
    function: Callable[..., Any] = field(repr=False)

    def schema(self) -> Schema:
        """The tool in the OpenAI format chat templates render (`apply_chat_template(tools=...)`)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def tool(
    function: Callable[..., Any] | Tool, name: str | None = None, description: str | None = None
) -> Tool:
    """The `Tool` of a typed, documented function; `TypeError` naming what a schema cannot say."""
    if isinstance(function, Tool):
        return function
    label = str(name or getattr(function, "__name__", ""))
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", label):
        raise TypeError(f"tool name {label!r}: give a name of letters, digits, _ and - (at most 64)")
    summary, documented = _read_docstring(inspect.getdoc(function) or "")
    try:
        hints = typing.get_type_hints(function)
    except Exception as exc:  # an annotation that names what is not importable
        raise TypeError(f"tool {label!r}: its annotations cannot be resolved ({exc})") from None
    properties: Schema = {}
    required = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            raise TypeError(f"tool {label!r}: parameter {parameter.name!r} must be a plain keyword parameter")
        if parameter.name not in hints:
            raise TypeError(f"tool {label!r}: parameter {parameter.name!r} has no type annotation")
        where = f"tool {label!r}: parameter {parameter.name!r}"
        properties[parameter.name] = json_schema(hints[parameter.name], where)
        if parameter.name in documented:
            properties[parameter.name]["description"] = documented[parameter.name]
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    parameters: Schema = {"type": "object", "properties": properties, "required": required}
    return Tool(label, description if description is not None else summary, parameters, function)


def json_schema(annotation: Any, where: str) -> Schema:
    """The JSON schema of a Python type; `TypeError` saying `where` when it has none."""
    simple = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if annotation in simple:
        return {"type": simple[annotation]}
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        kinds = {simple.get(type(a), "") for a in args}
        if "" in kinds or len(kinds) != 1:
            raise TypeError(f"{where}: a Literal of one kind of int, float, str or bool values")
        return {"type": kinds.pop(), "enum": list(args)}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return json_schema(Literal[tuple(m.value for m in annotation)], where)  # type: ignore[misc]
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = json_schema(rest[0] if len(rest) == 1 else Union[tuple(rest)], where)  # noqa: UP007
        return {**inner, "nullable": True}
    if origin in (list, Sequence, tuple) and (origin is not tuple or args[1:] == (Ellipsis,)):
        return {"type": "array", "items": json_schema(args[0], where)} if args else {"type": "array"}
    if origin in (dict, Mapping) and (not args or args[0] is str):
        return {"type": "object", **({"additionalProperties": json_schema(args[1], where)} if args else {})}
    raise TypeError(
        f"{where} has type {annotation!r}, which a JSON schema here cannot say: use int, float, str, bool,"
        " Literal, an Enum, list[...], dict[str, ...] or X | None"
    )


def argument_problem(schema: Schema, value: Any, path: str = "arguments") -> str | None:
    """Why `value` does not fit `schema` (naming where: `argument 'x'`); None when it does."""
    if value is None and schema.get("nullable"):
        return None
    kind = str(schema.get("type", ""))
    fits = {
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(kind, True)
    if not fits:
        return f"{path} must be {_article(kind)}, got {_json_kind(value)} {_short(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} must be one of {', '.join(map(repr, schema['enum']))}, got {_short(value)}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            if problem := argument_problem(schema["items"], item, f"{path}[{i}]"):
                return problem
    if kind == "object" and "properties" in schema:
        return _object_problem(schema, value, path)
    if kind == "object" and "additionalProperties" in schema:
        for key, item in value.items():
            if problem := argument_problem(schema["additionalProperties"], item, f"{path}[{key!r}]"):
                return problem
    return None


def _object_problem(schema: Schema, value: dict[str, Any], path: str) -> str | None:
    properties: Schema = schema["properties"]
    unknown = [key for key in value if key not in properties]
    if unknown:
        return f"unknown argument {unknown[0]!r}: the arguments are {', '.join(properties) or 'none'}"
    missing = [key for key in schema.get("required", ()) if key not in value]
    if missing:
        return f"missing argument {missing[0]!r}"
    for key, item in value.items():
        inner = f"argument {key!r}" if path == "arguments" else f"{path}[{key!r}]"
        if problem := argument_problem(properties[key], item, inner):
            return problem
    return None


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the description: the text before the first section, the parameters' descriptions)."""
    summary: list[str] = []
    described: dict[str, str] = {}
    section, last = "", ""
    for line in doc.splitlines():
        if heading := _SECTION.match(line):
            section, last = heading.group(1), ""
        elif rest := _REST_ARG.match(line):
            section, last = "rest", rest.group(1)
            described[last] = rest.group(2).strip()
        elif section in ("Args", "Arguments", "Parameters") and (arg := _GOOGLE_ARG.match(line)):
            last = arg.group(1).lstrip("*")
            described[last] = arg.group(2).strip()
        elif last and line.strip() and section:
            described[last] = f"{described[last]} {line.strip()}".strip()
        elif not section and not line.startswith(":"):
            summary.append(line)
    return " ".join(" ".join(summary).split()), described


def _article(kind: object) -> str:
    return {"integer": "an integer", "array": "an array", "object": "an object"}.get(str(kind), f"a {kind}")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}.get(
        type(value), "object"
    )


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
