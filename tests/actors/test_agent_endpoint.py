"""Agent episodes on a tiny real model through the real `openai` client and the worker's endpoint on
loopback: responses well-formed, their ids and log-probs the engine's (and the learner's), a
conversation that goes on continues one sequence, a rewritten one becomes another, concurrent calls
share engine calls, malformed requests get OpenAI errors, and no call is answered after its episode."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from cadence.model.checkpoint import load_checkpoint
from cadence.model.engine import SamplingParams
from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.rollout.agent.calls import choice_seed
from cadence.rollout.agent.episodes import AgentEpisodes, AgentTask
from cadence.rollout.agent.sampling import Sampling
from cadence.rollout.play import EngineGenerate
from cadence.rollout.results import GroupSamples
from cadence.rollout.streaming import StreamingGenerate
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generated
from tests.agent_rig import byte_checkpoint, recording_engine
from tests.turns import JoinWaiting, RecordingTurns

pytestmark = pytest.mark.timeout(60)

SEEDS = [11, 12]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return byte_checkpoint(tmp_path_factory.mktemp("agent") / "ckpt")


@pytest.fixture
def engine(checkpoint: Path) -> RecordingTurns:
    return recording_engine(checkpoint)


async def play(
    agent: Callable[[Any, AgentTask], Awaitable[object]],
    generate: Any,
    tokenizer: HFTokenizer,
    seeds: list[int] = SEEDS,
    bounds: Bounds | None = None,
    gather_s: float = 0.003,
    sampling: Sampling | None = None,
) -> GroupSamples:
    episodes = AgentEpisodes(
        "tests:agent",
        agent,
        tokenizer,
        bounds or Bounds(max_turn_tokens=128),
        gather_s=gather_s,
        sampling=sampling or Sampling(),
    )
    prompt = Prompt(3, "What is 2+2?", "4")
    (group,) = await episodes.run(
        generate, [(prompt, seeds, tokenizer.encode_prompt(prompt.text))], tokenizer.eos_id
    )
    return group


def ask(task: AgentTask, text: str | None = None) -> list[Any]:
    return [{"role": "user", "content": text or task.prompt}]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_a_call_is_answered_with_the_engines_ids_and_log_probs(
    checkpoint: Path, temperature: float
) -> None:
    tokenizer = HFTokenizer(checkpoint)
    engine = recording_engine(checkpoint, temperature=temperature)
    answers: dict[int, dict[str, Any]] = {}

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        models = await client.models.list()
        assert [m.id for m in models.data] == [task.model]
        reply = await client.chat.completions.create(  # a temperature of its own: served at the run's
            model=task.model, messages=ask(task), max_tokens=8, temperature=1.9
        )
        answers[task.seed] = reply.model_dump()
        return 1.0

    group = await play(agent, EngineGenerate(engine), tokenizer, sampling=Sampling(temperature))
    prompt = tokenizer.encode_prompt("What is 2+2?")
    model, _ = load_checkpoint(checkpoint)
    for i, seed in enumerate(SEEDS):
        body, sampled = answers[seed], engine.asked[seed]
        (choice,) = body["choices"]
        assert body["object"] == "chat.completion" and body["model"] == "cadence" and body["id"]
        assert body["cadence"] == {
            "version": 0,
            "temperature": temperature,
            "top_p": 1.0,
            "overridden": ["temperature"],
        }
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
        assert body["prompt_token_ids"] == prompt == sampled.prompt and sampled.max_new_tokens == 8
        assert (
            choice["token_ids"] == sampled.completion.tokens
            and choice["token_logprobs"] == sampled.completion.logprobs
        )
        assert choice["message"]["content"] == (tokenizer.decode_response(sampled.completion.tokens) or None)
        usage = {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        assert usage == {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(sampled.completion.tokens),
            "total_tokens": len(prompt) + len(sampled.completion.tokens),
        }
        assert group.prompt == prompt and group.completions[i] == sampled.completion.tokens
        assert group.masks[i] == [1] * len(sampled.completion.tokens) and group.scores[i].reward == 1.0
        ids = prompt + sampled.completion.tokens  # the learner's log-probs at the run's temperature
        with torch.no_grad():
            forward = torch.log_softmax(model(torch.tensor([ids]))[0].float() / temperature, dim=-1)
        for j, token in enumerate(sampled.completion.tokens):
            assert choice["token_logprobs"][j] == pytest.approx(
                float(forward[len(prompt) + j - 1, token]), abs=2e-4
            )
    assert (
        group.episodes is not None and group.episodes.turns == [1, 1] and group.episodes.sequences == [1, 1]
    )


async def test_a_conversation_that_goes_on_is_one_sequence_with_the_messages_masked(
    engine: RecordingTurns, checkpoint: Path
) -> None:
    tokenizer = HFTokenizer(checkpoint)
    bodies: list[dict[str, Any]] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        for more in ("Again.", "Once more."):
            reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=6)
            bodies.append(reply.model_dump())
            messages += [reply.choices[0].message, {"role": "user", "content": more}]
        return 0.5

    group = await play(agent, EngineGenerate(engine), tokenizer, seeds=[21])
    first, second = bodies
    sampled = first["choices"][0]["token_ids"]
    assert (
        second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(sampled)]
        == first["prompt_token_ids"] + sampled
    )
    between = second["prompt_token_ids"][len(first["prompt_token_ids"]) + len(sampled) :]
    ended = first["choices"][0]["finish_reason"] == "stop"
    text = ("" if ended else "<|im_end|>") + "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(between, skip_special=False) == text
    last = second["choices"][0]["token_ids"]
    assert group.prompt == first["prompt_token_ids"]
    assert group.completions[0] == sampled + between + last
    assert group.masks[0] == [1] * len(sampled) + [0] * len(between) + [1] * len(last)
    assert (
        group.logprobs[0]
        == first["choices"][0]["token_logprobs"]
        + [0.0] * len(between)
        + second["choices"][0]["token_logprobs"]
    )
    assert group.episodes is not None and group.episodes.turns == [2] and group.episodes.sequences == [1]
    assert group.episodes.call_tokens == [len(sampled) + len(last)]


class Scripted:
    """A `Generate` that answers every row with `text` (and its end of turn), log-prob -0.5 a token."""

    def __init__(self, tokenizer: HFTokenizer, text: str, max_context: int = 4096) -> None:
        self.ids = tokenizer.encode(text) + [tokenizer.eos_id]
        self.max_context = max_context
        self.calls: list[list[list[int]]] = []

    async def __call__(self, prompts: Any, seeds: Any, max_new_tokens: Any) -> list[Generated]:
        self.calls.append([list(p) for p in prompts])
        return [
            Generated(self.ids[:n], [-0.5] * len(self.ids[:n]), n >= len(self.ids)) for n in max_new_tokens
        ]


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


async def test_a_tool_call_comes_back_in_openai_form_and_its_result_continues_the_sequence(
    checkpoint: Path,
) -> None:
    tokenizer = HFTokenizer(checkpoint)
    scripted = Scripted(tokenizer, "Let me add. " + CALL)
    seen: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        seen.append(reply)
        message = reply.choices[0].message
        (call,) = message.tool_calls or []
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        messages += [
            message,
            {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])},
        ]
        seen.append(await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS))  # type: ignore[arg-type]
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    first, second = seen
    assert (
        first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content == "Let me add."
    )
    assert first.choices[0].message.tool_calls[0].function.name == "add"
    assert "<tools>" in tokenizer.decode(first.model_extra["prompt_token_ids"], skip_special=False)
    kept = first.model_extra["prompt_token_ids"] + scripted.ids  # the call's exact ids, not rendered again
    assert second.model_extra["prompt_token_ids"][: len(kept)] == kept
    between = tokenizer.decode(second.model_extra["prompt_token_ids"][len(kept) :], skip_special=False)
    assert (
        between
        == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert group.episodes is not None and group.episodes.sequences == [1] and group.episodes.tool_calls == [2]


async def test_a_streamed_answer_joins_to_the_whole_one_and_the_sequence_goes_on(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    scripted = Scripted(tokenizer, "Let me add. " + CALL)
    whole: list[Any] = []
    streamed: list[list[Any]] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        whole.append(await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS))  # type: ignore[arg-type]
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model=task.model,
            messages=messages,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed.append([chunk async for chunk in stream])
        content = "".join(c.choices[0].delta.content or "" for c in streamed[0] if c.choices)
        calls = [t for c in streamed[0] if c.choices for t in c.choices[0].delta.tool_calls or []]
        said = {"role": "assistant", "content": content, "tool_calls": [t.model_dump() for t in calls]}
        messages += [said, {"role": "tool", "tool_call_id": calls[0].id, "content": "4"}]
        await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    (reply,), (events,) = whole, streamed
    first, end, usage = events
    assert {e.object for e in events} == {"chat.completion.chunk"} and first.id == end.id == usage.id
    delta = first.choices[0].delta
    assert delta.role == "assistant" and delta.content == reply.choices[0].message.content == "Let me add."
    (call,) = delta.tool_calls or []
    (whole_call,) = reply.choices[0].message.tool_calls or []
    assert (call.index, call.function.name, call.function.arguments) == (  # type: ignore[union-attr]
        0,
        whole_call.function.name,  # type: ignore[union-attr]
        whole_call.function.arguments,  # type: ignore[union-attr]
    )
    assert first.choices[0].model_extra["token_ids"] == scripted.ids  # type: ignore[index]
    assert first.model_extra["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]  # type: ignore[index]
    assert end.choices[0].finish_reason == "tool_calls" and not usage.choices
    assert usage.usage is not None and usage.usage.completion_tokens == len(scripted.ids)
    # the streamed answer, joined and sent back, is continued on its own ids, as a whole one is; the
    # whole answer to the same messages is the episode's other sequence
    kept = first.model_extra["prompt_token_ids"] + scripted.ids  # type: ignore[index]
    assert [len(batch) for batch in scripted.calls] == [1, 1, 1] and scripted.calls[2][0][: len(kept)] == kept
    assert group.episodes is not None and group.episodes.turns == [3] and group.episodes.sequences == [2]


async def test_a_rewritten_history_is_a_sequence_of_its_own_and_each_is_trained(
    checkpoint: Path,
) -> None:
    tokenizer = HFTokenizer(checkpoint)
    scripted = Scripted(tokenizer, "four")
    answered: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        reply = await client.chat.completions.create(model=task.model, messages=messages)
        messages += [reply.choices[0].message, {"role": "user", "content": "Sure?"}]
        answered.append(await client.chat.completions.create(model=task.model, messages=messages))
        summary: list[Any] = [
            {"role": "user", "content": "Someone said four. Is it right?"}
        ]  # history rewritten
        answered.append(
            await client.chat.completions.create(model=task.model, messages=summary, max_tokens=2)
        )
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    longer, rewritten = answered
    assert rewritten.model_extra["prompt_token_ids"] == tokenizer.encode_prompt(
        "Someone said four. Is it right?"
    )
    assert group.episodes is not None and group.episodes.sequences == [2] and group.episodes.turns == [3]
    assert group.episode_of == [0, 0]  # one episode, two rows
    assert group.prompt + group.completions[0] == longer.model_extra["prompt_token_ids"] + scripted.ids
    assert sum(group.masks[0]) == 2 * len(scripted.ids)
    rewritten_ids = rewritten.model_extra["prompt_token_ids"] + scripted.ids[:2]
    assert group.prompt + group.completions[1] == rewritten_ids
    assert group.masks[1][-2:] == [1, 1] and sum(group.masks[1]) == 2


async def test_concurrent_agents_calls_share_engine_calls(engine: RecordingTurns, checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    batches: list[int] = []
    generate = EngineGenerate(engine)

    class Counting:
        max_context = generate.max_context

        async def __call__(self, prompts: Any, seeds: Any, limits: Any) -> list[Generated]:
            batches.append(len(prompts))
            return await generate(prompts, seeds, limits)

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        for _ in range(2):
            reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
            messages += [reply.choices[0].message, {"role": "user", "content": "More."}]
        return 0.0

    # a gathering window far longer than the calls take to arrive: each turn's 4 calls go out together
    await play(agent, Counting(), tokenizer, seeds=[1, 2, 3, 4], gather_s=30.0)
    assert batches == [4, 4]


async def test_choices_are_sampled_with_seeds_of_their_own_and_each_is_trained(
    engine: RecordingTurns, checkpoint: Path
) -> None:
    tokenizer = HFTokenizer(checkpoint)
    bodies: list[dict[str, Any]] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=6, n=2)
        messages += [reply.choices[1].message, {"role": "user", "content": "Go on."}]
        bodies.append(reply.model_dump())
        bodies.append(
            (
                await client.chat.completions.create(model=task.model, messages=messages, max_tokens=6)
            ).model_dump()
        )
        return 1.0

    group = await play(agent, EngineGenerate(engine), tokenizer, seeds=[31])
    both, last = bodies
    first, second = (c["token_ids"] for c in both["choices"])
    seeds = [choice_seed(31, 0, j) for j in range(2)]
    assert [engine.asked[s].completion.tokens for s in seeds] == [first, second] and seeds[0] == 31
    assert (
        last["prompt_token_ids"][: len(both["prompt_token_ids"]) + len(second)]
        == both["prompt_token_ids"] + second
    )
    assert group.episodes is not None and group.episodes.sequences == [
        2
    ]  # the choice left, and the one gone on from: both trained
    assert group.episode_of == [0, 0] and group.completions[0] == first and group.masks[0] == [1] * len(first)
    assert group.completions[1][: len(second)] == second and sum(group.masks[1]) == len(second) + len(
        last["choices"][0]["token_ids"]
    )


async def test_a_stop_string_cuts_the_answer_and_the_turns_end_is_the_templates(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    scripted = Scripted(tokenizer, "four. five.")
    bodies: list[dict[str, Any]] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        reply = await client.chat.completions.create(model=task.model, messages=messages, stop=["."])
        bodies.append(reply.model_dump())
        messages += [reply.choices[0].message, {"role": "user", "content": "Sure?"}]
        bodies.append(
            (await client.chat.completions.create(model=task.model, messages=messages)).model_dump()
        )
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    (choice,) = bodies[0]["choices"]
    assert choice["message"]["content"] == "four" and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == tokenizer.encode("four.")  # sampled up to the stop, no further
    after = bodies[1]["prompt_token_ids"][len(bodies[0]["prompt_token_ids"]) + len(choice["token_ids"]) :]
    assert tokenizer.decode(after, skip_special=False).startswith("<|im_end|>\n<|im_start|>user\nSure?")
    assert group.episodes is not None and group.episodes.sequences == [1]


async def test_an_agents_call_made_while_the_engine_decodes_joins_its_running_call(checkpoint: Path) -> None:
    """On the built-in engine an agent's next call joins the engine's running call, and every call is
    answered with its own sample."""
    tokenizer = HFTokenizer(checkpoint)
    model, _ = load_checkpoint(checkpoint)
    engine = JoinWaiting(model, tokenizer.eos_id)
    held = StreamingGenerate(TorchRolloutEngine(engine, SamplingParams(16, temperature=1.0)))
    answered: dict[int, list[int]] = {}

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        for _ in range(3):
            reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
            answered.setdefault(task.seed, []).append(len(reply.model_dump()["choices"][0]["token_ids"]))
            messages += [reply.choices[0].message, {"role": "user", "content": "More."}]
        return 0.0

    group = await play(agent, held, tokenizer, seeds=[1, 2, 3, 4])
    assert engine.joined > 0  # a call made while the engine decoded went into that engine call
    assert sorted(answered) == [1, 2, 3, 4] and all(len(n) == 3 and min(n) >= 1 for n in answered.values())
    assert group.episodes is not None and group.episodes.turns == [3, 3, 3, 3]
