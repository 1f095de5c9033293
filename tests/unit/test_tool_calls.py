"""Tool calls read out of a model turn in its family's format: Hermes `<tool_call>` blocks and Llama
3.1 JSON objects, several a turn, and every malformed call kept with a reason the model can act on."""

from __future__ import annotations

import json

from cadence.tasks.tools.calls import MAX_CALL_CHARS, BadCall, ToolCall, parse, write_call


def test_hermes_reads_every_block_in_order_and_text_around_them() -> None:
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\nand\n'
        '<tool_call>{"name": "neg", "arguments": "{\\"x\\": 3}"}</tool_call>'
    )
    assert parse(text, "hermes").calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("neg", {"x": 3})]


def test_a_turn_without_a_call_is_an_answer() -> None:
    assert parse("The answer is 42.", "hermes").calls == []
    assert parse("The answer is 42.", "llama3").calls == []
    assert parse('I would write {"name": "x"} but no.', "llama3").calls == []


def test_malformed_hermes_calls_are_each_answered_not_dropped() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
        '<tool_call>["add", 1]</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{not json"}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "cut", "argum'
    )
    parsed = parse(text, "hermes")
    whys = [call.why if isinstance(call, BadCall) else call for call in parsed.calls]
    assert whys[0].startswith("the call is not valid JSON (Expecting property name")  # type: ignore[union-attr]
    assert 'write a call as <tool_call>{"name": "name"' in whys[0]  # type: ignore[operator]
    assert whys[1].startswith("the call is a JSON list, not an object")  # type: ignore[union-attr]
    assert whys[2].startswith('the call has no "name" string')  # type: ignore[union-attr]
    assert whys[3] == "the arguments of 'add' are not a JSON object"
    assert whys[4].startswith("the arguments of 'add' are a string that is not JSON")  # type: ignore[union-attr]
    assert whys[5] == ToolCall("add", {"a": 1})
    assert whys[6].startswith("a <tool_call> without its </tool_call>")  # type: ignore[union-attr]
    assert parsed.bad == 6


def test_a_huge_call_is_refused_unread() -> None:
    body = json.dumps({"name": "echo", "arguments": {"text": "x" * MAX_CALL_CHARS}})
    (call,) = parse(f"<tool_call>{body}</tool_call>", "hermes").calls
    assert call == BadCall(f"the call is {len(body)} characters, more than {MAX_CALL_CHARS}")
    (call,) = parse(body, "llama3").calls
    assert isinstance(call, BadCall) and "more than" in call.why


def test_llama3_reads_one_object_several_or_a_list_after_its_python_tag() -> None:
    one = '{"name": "add", "parameters": {"a": 1}}'
    assert parse(one, "llama3").calls == [ToolCall("add", {"a": 1})]
    assert parse(f"<|python_tag|>{one}", "llama3").calls == [ToolCall("add", {"a": 1})]
    two = f'{one}; {{"name": "neg", "parameters": {{"x": 2}}}}'
    assert parse(two, "llama3").calls == [ToolCall("add", {"a": 1}), ToolCall("neg", {"x": 2})]
    assert parse(f"[{one}, {one}]", "llama3").calls == [ToolCall("add", {"a": 1})] * 2


def test_llama3_malformed_json_is_one_bad_call_after_the_good_ones() -> None:
    parsed = parse('{"name": "add", "parameters": {"a": 1}}\n{"name": "add", "parameters": {', "llama3")
    assert parsed.calls[0] == ToolCall("add", {"a": 1})
    assert isinstance(parsed.calls[1], BadCall) and parsed.calls[1].why.startswith(
        "the call is not valid JSON"
    )


def test_a_written_call_reads_back_in_its_own_family() -> None:
    for family in ("hermes", "llama3"):
        written = write_call("convert", {"value": 2, "unit": "km"}, family)  # type: ignore[arg-type]
        assert parse(written, family).calls == [ToolCall("convert", {"value": 2, "unit": "km"})]  # type: ignore[arg-type]
    assert parse(write_call("f", {}, "hermes"), "llama3").calls == []  # each its own


def test_the_content_is_the_text_outside_the_calls_read() -> None:
    good = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert parse(f"Adding. {good} done", "hermes").content == "Adding.  done"
    assert parse(f"x {good}<tool_call>[1]</tool_call>", "hermes").content == "x <tool_call>[1]</tool_call>"
    assert parse("The answer is 4.", "llama3").content == "The answer is 4."
    one = '{"name": "add", "parameters": {"a": 1}}'
    assert parse(f"<|python_tag|>{one}; {one}", "llama3").content == ""
    assert parse(f'{one}\n{{"name": 3}}', "llama3").content == '{"name": 3}'  # a bad call stays
    assert parse('{"name": 3}', "llama3").content == '{"name": 3}'
