"""The chat template's turn boundary as token ids: SmolLM2's ChatML template (when its tokenizer is in
the cache), a template that rewrites earlier turns (refused), and the character tokenizer (none)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.tokenizer import CharTokenizer
from cadence.model.turns import ChatTurns, render
from cadence.tasks.environments.base import ChatMessage

SMOLLM2 = Path.home() / ".cache" / "cadence" / "smollm2-135m-instruct"
needs_smollm2 = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(),
    reason=f"SmolLM2's tokenizer is not at {SMOLLM2} (`make smollm2` puts it there)",
)


@needs_smollm2
def test_smollm2_messages_sit_between_chatml_turns() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    turns = ChatTurns(tokenizer)
    assert turns.eos_text == "<|im_end|>"
    after_eos = "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    assert turns.encode_reply("Higher.", finished=True) == tokenizer.encode(after_eos)
    assert turns.encode_reply("Higher.", finished=False) == tokenizer.encode("<|im_end|>" + after_eos)
    tool = ChatTurns(tokenizer, role="tool").encode_reply("42", finished=True)
    assert (
        tokenizer.decode(tool, skip_special=False)
        == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


@needs_smollm2
def test_smollm2_ids_appended_turn_by_turn_decode_to_the_templates_rendering() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    turns = ChatTurns(tokenizer)
    conversation = [
        ("user", "Guess my number."),
        ("assistant", "50"),
        ("user", "Lower."),
        ("assistant", "25"),
    ]
    ids = turns.encode_prompt(conversation[0][1])
    for (_, model), (_, message) in zip(conversation[1::2], [*conversation[2::2], ("user", "")], strict=True):
        ids += tokenizer.encode(model) + [tokenizer.eos_id]  # as the engine samples it: text, then eos
        if message:
            ids += turns.encode_reply(message, finished=True)
    messages = [{"role": role, "content": text} for role, text in conversation]
    # the template ends the last turn with a newline after its eos, which no model samples
    assert tokenizer.decode(ids, skip_special=False) + "\n" == render(tokenizer, messages, False)


@needs_smollm2
def test_smollm2_a_conversation_opening_is_the_templates_rendering_and_turns_append_to_it() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    turns = ChatTurns(tokenizer)
    opening = [
        ChatMessage("system", "Use the calculator."),
        ChatMessage("user", "Calculate 17 * 23."),
        ChatMessage("assistant", "<calc>17*23</calc>"),
        ChatMessage("user", "<result>391</result>"),
        ChatMessage("assistant", "391"),
        ChatMessage("user", "Calculate 5 * 33."),
    ]
    messages = [{"role": m.role, "content": m.content} for m in opening]
    ids = turns.encode_prompt(opening)
    assert tokenizer.decode(ids, skip_special=False) == render(tokenizer, messages, True)
    assert "SmolLM" not in tokenizer.decode(ids)  # the system prompt given replaces the template's own
    ids += (
        tokenizer.encode("<calc>5*33</calc>")
        + [tokenizer.eos_id]
        + turns.encode_reply("<result>165</result>", True)
    )
    more = [
        *messages,
        {"role": "assistant", "content": "<calc>5*33</calc>"},
        {"role": "user", "content": "<result>165</result>"},
    ]
    assert tokenizer.decode(ids, skip_special=False) == render(tokenizer, more, True)


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path: Path) -> None:
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.skip(f"SmolLM2's tokenizer is not at {SMOLLM2}")
    shutil.copy(SMOLLM2 / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((SMOLLM2 / "tokenizer_config.json").read_text())
    # the last user message is shown first, as some templates move a system or tool message
    config["chat_template"] = (
        "{% for m in messages|reverse %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="turns cannot be appended as token ids"):
        ChatTurns(HFTokenizer(tmp_path))


def test_without_a_template_a_message_is_its_own_ids() -> None:
    tokenizer = CharTokenizer("0123456789+-=? abcdefghijklmnopqrstuvwxyz.")
    turns = ChatTurns(tokenizer)
    assert turns.encode_reply("lower.", finished=True) == tokenizer.encode("lower.")
    assert turns.encode_reply("lower.", finished=False) == tokenizer.encode("lower.")
    assert turns.encode_prompt("1+2=?") == tokenizer.encode_prompt("1+2=?")
    assert turns.decode_response([*tokenizer.encode("3"), tokenizer.eos_id]) == "3"


def test_a_template_may_raise_and_tell_the_date_as_transformers_lets_it(tmp_path: Path) -> None:
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.skip(f"SmolLM2's tokenizer is not at {SMOLLM2}")
    import jinja2

    from tests.tool_rig import with_template

    template = (
        "{{ strftime_now('%Y') }}{% for m in messages %}{% if m.role == 'robot' %}"
        "{{ raise_exception('no robots here') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    tokenizer = with_template(tmp_path, template)
    assert render(tokenizer, [{"role": "user", "content": "hi"}], False)[4:] == "hi"
    with pytest.raises(jinja2.exceptions.TemplateError, match="no robots here"):
        render(tokenizer, [{"role": "robot", "content": "hi"}], False)
