"""The Hermes tool-call form: calls parsed out of a completion into OpenAI's form, what is not a call
left as written, and a conversation's calls, results and tools as the template's messages."""

from __future__ import annotations

import json

from cadence.rollout.agent import hermes
from cadence.rollout.agent.chat import Said, canonical, template_messages
from cadence.rollout.agent.hermes import ToolCall


def test_calls_are_parsed_out_of_the_text_and_the_rest_is_the_content() -> None:
    text = 'Adding. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text += '<tool_call>{"name": "neg", "arguments": "{\\"x\\": 3}"}</tool_call>'
    parsed = hermes.parse(text)
    assert parsed.content == "Adding."
    assert [c.name for c in parsed.calls] == ["add", "neg"]
    assert (
        json.loads(parsed.calls[0].arguments) == {"a": 1, "b": 2} and parsed.calls[1].arguments == '{"x": 3}'
    )


def test_what_is_no_call_stays_in_the_content_as_written() -> None:
    for text in [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call>[1]",
        "",
    ]:
        parsed = hermes.parse(text)
        assert parsed.calls == [] and parsed.content == (text or None)
    assert hermes.parse('<tool_call>{"name": "f"}</tool_call>').content is None


def test_a_call_written_again_parses_to_itself() -> None:
    calls = [ToolCall("add", '{"a": 1}'), ToolCall("say", '{"text": "é"}')]
    assert hermes.parse(hermes.call_text(calls)).calls == [
        ToolCall("add", '{"a": 1}'),
        ToolCall("say", '{"text": "é"}'),
    ]


def test_calls_results_and_tools_become_the_templates_messages() -> None:
    said = [
        Said("system", "Be brief."),
        Said("user", "2+2?"),
        Said("assistant", "", (ToolCall("add", '{"a": 2, "b": 2}'),)),
        Said("tool", "4"),
    ]
    tools = [{"type": "function", "function": {"name": "add"}}]
    messages = template_messages(said, tools, "tool")
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "add"' in messages[0]["content"] and messages[1] == {"role": "user", "content": "2+2?"}
    assert hermes.parse(messages[2]["content"]).calls == [ToolCall("add", '{"a": 2, "b": 2}')]
    assert messages[3] == {"role": "tool", "content": "<tool_response>\n4\n</tool_response>"}
    assert template_messages(said[1:2], tools, "user")[0]["role"] == "system"


def test_messages_compare_whatever_the_arguments_spelling() -> None:
    one = Said("assistant", " ok ", (ToolCall("f", '{"b": 1, "a": 2}'),))
    other = Said("assistant", "ok", (ToolCall("f", '{"a":2,"b":1}'),))
    assert canonical(one) == canonical(other)
