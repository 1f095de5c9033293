"""Tools the way models call them: a typed, documented Python function becomes an OpenAI-format JSON
schema (`schema.py`), a model turn's calls are read in its chat template's family format (`calls.py`),
run and answered within the step's time (`toolbox.py`), and a tool environment is made of a list of
functions and a task (`environment.py`). See docs/environments.md, "Tools".
"""

from cadence.tasks.tools.calls import BadCall, Parsed, ToolCall, parse, write_call
from cadence.tasks.tools.environment import Example, ToolEnvironment, math_answer, tool_environment
from cadence.tasks.tools.schema import Tool, tool
from cadence.tasks.tools.toolbox import Answer, Toolbox, ToolError

__all__ = [
    "Answer",
    "BadCall",
    "Example",
    "Parsed",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "ToolError",
    "Toolbox",
    "math_answer",
    "parse",
    "tool",
    "tool_environment",
    "write_call",
]
