"""Tool episodes in the model's own format, token in and token out, on SmolLM2's tokenizer: schemas
declared by a system block (SmolLM2's template has no tools) or by a template's own `tools`, calls
in Hermes or Llama 3.1 form, results as the template's tool messages, and ids that do not drift under
a template that drops earlier `<think>` blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.turns import ChatTurns, render
from cadence.rollout.play import episode_group
from cadence.tasks.base import Prompt
from cadence.tasks.environments.base import ChatMessage
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.episode_record import EpisodeResult
from cadence.tasks.environments.generation import turn_seed
from cadence.tasks.environments.runner import EpisodeRunner
from cadence.tasks.environments.tool_calculator import INSTRUCTIONS, ToolCalculator
from cadence.tasks.environments.units import Units
from tests.tool_rig import SMOLLM2, Scripted, needs_smollm2, with_template

pytestmark = [needs_smollm2, pytest.mark.timeout(60)]

QUESTION = Prompt(4, "What is 12 * (3 + 4)?", "84")
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12*(3+4)"}}\n</tool_call>'

# Qwen2.5-style: the tools in the system message, tool results grouped as the user's <tool_response>s
NATIVE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}{% if messages[0].role == 'system' %}"
    "{{ messages[0].content + '\n\n' }}{% endif %}{{ '# Tools\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    '{{ \'\n</tools>\nCall as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n\' }}'
    "{% elif messages[0].role == 'system' %}{{ '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{% endif %}{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% elif m.role != 'system' %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama 3.1-style: the tools in the first user message, results as ipython messages
LLAMA = (
    "{% for m in messages %}{% set role = 'ipython' if m.role == 'tool' else m.role %}"
    "{% set text = m.content %}{% if loop.index0 == (1 if messages[0].role == 'system' else 0) and tools %}"
    "{% set text = 'Respond with {\"name\": ..., \"parameters\": ...}.\n' + (tools | map('tojson') | join('\n'))"
    " + '\n\n' + text %}{% endif %}{{ '<|im_start|>' + role + '\n' + text + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3-style: earlier assistant turns are rendered without their <think> block
DROPS_THINKING = (
    "{% for m in messages %}{% set text = m.content %}"
    "{% if m.role == 'assistant' and not loop.last and '</think>' in text %}"
    "{% set text = text.split('</think>')[-1].lstrip() %}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


async def _play(
    tokenizer: HFTokenizer, scripts: dict[int, list[str]], factory: object = ToolCalculator
) -> tuple[Scripted, ChatTurns, list[EpisodeResult]]:
    model = Scripted(tokenizer, scripts)
    codec = ChatTurns(tokenizer)
    runner = EpisodeRunner(factory, model, codec, Bounds(max_tokens=2000))  # type: ignore[arg-type]
    return model, codec, await runner.run([(QUESTION, seed) for seed in scripts])


def _token_in_token_out(model: Scripted, codec: ChatTurns, result: EpisodeResult) -> list[list[int]]:
    """Check the episode is the engine's turns and the environment's ids between them, each turn asked
    with exactly the ids before it; the environment's ids of each answered turn."""
    held, messages, at = list(result.prompt_tokens), [], 0
    for turn in range(result.model_turns):
        seed = turn_seed(result.seed, turn)
        assert model.asked[seed] == held
        held += model.sampled[seed]
        at += len(model.sampled[seed])
        assert result.mask[at - len(model.sampled[seed]) : at] == [1] * len(model.sampled[seed])
        following = next((i for i in range(at, len(result.mask)) if result.mask[i] == 1), len(result.mask))
        messages.append(result.tokens[at:following])
        held += result.tokens[at:following]
        at = following
    assert held == result.prompt_tokens + result.tokens
    group = episode_group([result], [], model.tokenizer.eos_id)  # what the trainer gets
    assert group.prompt + group.completions[0] == held
    return [m for m in messages if m]


async def test_smollm2_declares_the_tools_in_a_system_block_and_reads_results_as_tool_messages() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    model, codec, (result,) = await _play(tokenizer, {5: [CALL, "84"]})
    assert codec.tool_format == "hermes"
    opening = tokenizer.decode(result.prompt_tokens, skip_special=False)
    assert opening.startswith(f"<|im_start|>system\n{INSTRUCTIONS}\n\n# Tools\n")
    assert '{"type": "function", "function": {"name": "calculate"' in opening
    assert "<|im_start|>assistant\n<tool_call>\n" in opening  # the worked example, in its own format
    (message,) = _token_in_token_out(model, codec, result)
    assert (
        tokenizer.decode(message, skip_special=False)
        == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (result.ended, result.score.reward, result.tool_calls, result.tool_errors) == ("done", 1.0, 1, 0)


async def test_several_calls_a_turn_each_answered_malformed_unknown_and_wrong_arguments_too() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    turn = (
        CALL
        + '<tool_call>{"name": "calculate", "arguments": {"expression": 7}}</tool_call>'
        + '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
        + "<tool_call>{oops</tool_call>"
        + '<tool_call>{"name": "calculate", "arguments": {"expression": "1/0"}}</tool_call>'
    )
    model, codec, (result,) = await _play(tokenizer, {1: [turn, "84"]})
    (message,) = _token_in_token_out(model, codec, result)
    results = result.turns[2].text.split("\n\n")
    assert results[0] == "84"
    assert results[1] == "error: calculate: argument 'expression' must be a string, got integer 7"
    assert results[2] == "error: unknown tool 'search'; the tools are: calculate"
    assert results[3].startswith("error: the call is not valid JSON")
    assert results[4] == "error: at most 4 calls a turn; 1 not run"
    assert (result.tool_calls, result.tool_errors, result.ended) == (5, 4, "done")
    shown = tokenizer.decode(message, skip_special=False)
    assert shown.count("<|im_start|>tool\n") == 5 and shown.endswith("<|im_start|>assistant\n")


async def test_a_template_with_its_own_tools_renders_schemas_and_groups_results(tmp_path: Path) -> None:
    tokenizer = with_template(tmp_path, NATIVE)
    two = CALL + CALL.replace("12*(3+4)", "2+2")
    model, codec, (result,) = await _play(tokenizer, {2: [two, "84"]})
    opening = tokenizer.decode(result.prompt_tokens, skip_special=False)
    schema = ToolCalculator(QUESTION, 0).tools()[0]
    declared = opening.split("# Tools\n<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(declared) == schema and "You may call" in opening
    (message,) = _token_in_token_out(model, codec, result)
    assert tokenizer.decode(message, skip_special=False) == (
        "\n<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n4\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # appended turn by turn, the ids decode to the template's rendering of the whole conversation
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": two},
        {"role": "tool", "content": "84"},
        {"role": "tool", "content": "4"},
    ]
    whole = render(tokenizer, conversation, True)
    assert whole.endswith(tokenizer.decode(model.sampled[2] + message, skip_special=False))


async def test_a_llama_template_reads_json_calls_and_answers_as_ipython(tmp_path: Path) -> None:
    tokenizer = with_template(tmp_path, LLAMA)
    calls = '{"name": "calculate", "parameters": {"expression": "12*(3+4)"}}; {"name": "calculate", "parameters": {}}'
    model, codec, (result,) = await _play(tokenizer, {3: [calls, "84"]})
    assert codec.tool_format == "llama3"
    opening = tokenizer.decode(result.prompt_tokens, skip_special=False)
    assert '<|im_start|>assistant\n{"name": "calculate", "parameters": {"expression": "17*23"}}' in opening
    (message,) = _token_in_token_out(model, codec, result)
    assert tokenizer.decode(message, skip_special=False) == (
        "\n<|im_start|>ipython\n84<|im_end|>\n<|im_start|>ipython\n"
        "error: calculate: missing argument 'expression'<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (result.score.reward, result.tool_calls, result.tool_errors) == (1.0, 2, 1)


async def test_ids_do_not_drift_under_a_template_that_drops_earlier_thinking(tmp_path: Path) -> None:
    tokenizer = with_template(tmp_path, DROPS_THINKING)
    first = f"<think>I should use the tool.</think>\n{CALL}"
    model, codec, (result,) = await _play(tokenizer, {7: [first, "<think>It said 84.</think>\n84"]})
    assert result.ended == "done" and result.score.reward == 1.0
    _token_in_token_out(model, codec, result)
    # the template, asked to render the episode again, would have dropped the first turn's thinking:
    # the trainer's ids would then not be the ones the engine sampled the second turn after
    held = tokenizer.decode(result.prompt_tokens + result.tokens, skip_special=False)
    assert "<think>I should use the tool.</think>" in held
    opening = json.loads(json.dumps([{"role": "user", "content": "q"}]))
    again = render(
        tokenizer,
        [
            *opening,
            {"role": "assistant", "content": first},
            {"role": "tool", "content": "84"},
            {"role": "assistant", "content": "84"},
        ],
        False,
    )
    assert "I should use the tool." not in again


async def test_the_units_environment_looks_up_and_converts() -> None:
    tokenizer = HFTokenizer(SMOLLM2)
    env = Units(QUESTION, 0)
    last = (await env.start())[-1]
    assert isinstance(last, ChatMessage)
    question = last.content
    item = next(
        name
        for name in ("Mont Blanc", "Kilimanjaro", "Denali", "Aconcagua", "Danube", "Rhine", "Thames", "Loire")
        if name in question
    )
    lookup = f'<tool_call>{{"name": "lookup", "arguments": {{"item": "{item}"}}}}</tool_call>'
    model, codec, (result,) = await _play(tokenizer, {0: [lookup, "0"]}, Units)
    assert result.turns[2].text.startswith(f'{{"item": "{item}"')
    assert (result.tool_calls, result.tool_errors, result.score.reward) == (1, 0, 0.0)
