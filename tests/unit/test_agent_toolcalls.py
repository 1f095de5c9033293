"""Tool calls between OpenAI's form and the model family's (the tools package's parsers): calls read out
of a completion into OpenAI's form, what is not a call left as written, and a conversation's calls,
results and tools as the template's messages, in the Hermes and the Llama 3 forms."""

from __future__ import annotations

import json

from cadence.rollout.agent import toolcalls
from cadence.rollout.agent.chat import Said, answer, canonical, template_messages
from cadence.rollout.agent.toolcalls import ToolCall


def test_calls_are_parsed_out_of_the_text_and_the_rest_is_the_content() -> None:
    text = 'Adding. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text += '<tool_call>{"name": "neg", "arguments": "{\\"x\\": 3}"}</tool_call>'
    parsed = toolcalls.read(text, "hermes")
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
        parsed = toolcalls.read(text, "hermes")
        assert parsed.calls == [] and parsed.content == (text or None)
    assert toolcalls.read('<tool_call>{"name": "f"}</tool_call>', "hermes").content is None


def test_a_call_written_again_parses_to_itself() -> None:
    calls = [ToolCall("add", '{"a": 1}'), ToolCall("say", '{"text": "é"}')]
    assert toolcalls.read(toolcalls.calls_text(calls, "hermes"), "hermes").calls == [
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
    assert toolcalls.read(messages[2]["content"], "hermes").calls == [ToolCall("add", '{"a": 2, "b": 2}')]
    assert messages[3] == {"role": "tool", "content": "<tool_response>\n4\n</tool_response>"}
    assert template_messages(said[1:2], tools, "user")[0]["role"] == "system"


def test_messages_compare_whatever_the_arguments_spelling() -> None:
    one = Said("assistant", " ok ", (ToolCall("f", '{"b": 1, "a": 2}'),))
    other = Said("assistant", "ok", (ToolCall("f", '{"a":2,"b":1}'),))
    assert canonical(one) == canonical(other)


def test_a_malformed_call_stays_in_the_content_and_the_read_ones_leave_it() -> None:
    text = 'A <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> B <tool_call>{oops}</tool_call>'
    read = toolcalls.read(text, "hermes")
    assert read.calls == [ToolCall("add", '{"a": 1}')]
    assert read.content == "A  B <tool_call>{oops}</tool_call>"


def test_llama3_calls_come_back_in_openai_form() -> None:
    one = '{"name": "add", "parameters": {"a": 1, "b": "é"}}'
    read = toolcalls.read(f"<|python_tag|>{one}\n{one}", "llama3")
    assert read.content is None and read.calls == [ToolCall("add", '{"a": 1, "b": "é"}')] * 2
    assert toolcalls.read("The answer is 4.", "llama3") == toolcalls.Answer("The answer is 4.", [])
    broken = f'{one}\n{{"name": "add", "parameters": {{'
    read = toolcalls.read(broken, "llama3")
    assert read.calls == [ToolCall("add", '{"a": 1, "b": "é"}')]
    assert read.content == '{"name": "add", "parameters": {'  # the part not read, as written
    assert toolcalls.read(one, "hermes").calls == []  # each family its own
    calls = [ToolCall("add", '{"a": 2}'), ToolCall("neg", '{"x": 3}')]
    assert toolcalls.read(toolcalls.calls_text(calls, "llama3"), "llama3").calls == calls


def test_llama3_conversations_are_written_in_its_form() -> None:
    said = [
        Said("user", "2+2?"),
        Said("assistant", "", (ToolCall("add", '{"a": 2, "b": 2}'),)),
        Said("tool", "4"),
    ]
    tools = [{"type": "function", "function": {"name": "add"}}]
    messages = template_messages(said, tools, "ipython", "llama3")
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith(
        "Given the following functions"
    )
    assert messages[2] == {"role": "assistant", "content": '{"name": "add", "parameters": {"a": 2, "b": 2}}'}
    assert messages[3] == {"role": "ipython", "content": "4"}  # no <tool_response> around it


def test_no_call_is_read_when_the_model_was_offered_no_tools() -> None:
    call = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    assert answer(call, None) == Said("assistant", call)
    assert answer(call, "hermes") == Said("assistant", "", (ToolCall("add", "{}"),))
