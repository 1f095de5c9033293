"""Agents written against the OpenAI client (`environment.agent`), as a user would write one: the
calculator agent (`calculator.py`). They import no cadence code beyond the tasks' own checks and
tools; see docs/environments.md."""
