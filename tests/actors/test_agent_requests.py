"""What the endpoint makes of a request's sampling and tool options, through the real `openai` client on
the tiny model: a temperature or top_p other than the batch's served at the batch's (and said) or
refused, an eval batch at the eval temperature, `tool_choice` "none" offers no tools and reads no call,
one that cannot be enforced is refused, a Llama 3 template's calls come back in OpenAI's form, and
`logprobs` in OpenAI's form are the engine's, and the endpoint serves on a Unix socket."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import openai
import pytest
from structlog.testing import capture_logs

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.episodes import AgentEpisodes, AgentTask
from cadence.rollout.agent.sampling import Sampling
from cadence.rollout.play import EngineGenerate
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from tests.actors.test_agent_endpoint import CALL, TOOLS, Scripted, ask, play
from tests.agent_rig import CHATML, byte_checkpoint, recording_engine

pytestmark = pytest.mark.timeout(60)


def options(tool_choice: object) -> dict[str, Any]:
    return {"tools": TOOLS, "tool_choice": tool_choice}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return byte_checkpoint(tmp_path_factory.mktemp("agent") / "ckpt")


async def test_another_temperature_or_top_p_is_served_at_the_runs_or_refused(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    bodies: list[dict[str, Any]] = []
    refused: list[openai.BadRequestError] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        asked: list[dict[str, float]] = [
            {},
            {"temperature": 0.7, "top_p": 0.9},
            {"temperature": 1.0},
            {"top_p": 0.5},
        ]
        for options in asked:
            try:
                reply = await client.chat.completions.create(model=task.model, messages=ask(task), **options)  # type: ignore[call-overload]
                bodies.append(reply.model_dump())
            except openai.BadRequestError as err:
                refused.append(err)
        return 1.0

    run = Sampling(0.7, 0.9, "run")
    with capture_logs() as logs:  # two episodes asking the same: each value said once
        await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1, 2], sampling=run)
    told = [(e["param"], e["asked"], e["served"]) for e in logs if e["event"] == "agent_sampling_overridden"]
    assert told == [("temperature", 1.0, 0.7), ("top_p", 0.5, 0.9)]
    said = sorted((body["cadence"] for body in bodies), key=str)  # the two episodes' calls interleave
    assert said == sorted(
        (
            {"version": 0, "temperature": 0.7, "top_p": 0.9, "overridden": overridden}
            for overridden in ([], [], ["temperature"], ["top_p"]) * 2
        ),
        key=str,
    )
    assert refused == []

    bodies.clear()
    await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1], sampling=Sampling(0.7, 0.9, "refuse"))
    assert [body["cadence"]["overridden"] for body in bodies] == [[], []]
    assert [(err.status_code, err.code, err.param) for err in refused] == [
        (400, "unsupported_value", "temperature"),
        (400, "unsupported_value", "top_p"),
    ]
    assert "the run's temperature = 0.7" in refused[0].message and "top_p = 0.9" in refused[1].message


async def test_an_eval_batch_is_served_at_the_eval_temperature(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    engine = recording_engine(checkpoint, temperature=1.0)
    bodies: list[dict[str, Any]] = []
    refused: list[openai.BadRequestError] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        for temperature in (0.0, 1.0):
            try:
                reply = await client.chat.completions.create(
                    model=task.model, messages=ask(task), max_tokens=6, temperature=temperature
                )
                bodies.append(reply.model_dump())
            except openai.BadRequestError as err:
                refused.append(err)
        return 1.0

    greedy = EngineGenerate(engine, temperature=0.0)  # what an eval batch's maker gives
    await play(agent, greedy, tokenizer, seeds=[5, 6], sampling=Sampling(1.0, 1.0, "refuse"))
    assert [body["cadence"]["temperature"] for body in bodies] == [0.0, 0.0]
    assert [body["cadence"]["overridden"] for body in bodies] == [[], []]
    assert [err.param for err in refused] == ["temperature"] * 2
    assert "the run's temperature = 0.0" in refused[0].message
    first, second = (body["choices"][0]["token_ids"] for body in bodies)
    assert first == second and first  # greedy: both seeds sample the same


async def test_tool_choice_none_offers_no_tools_and_reads_no_call(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    scripted = Scripted(tokenizer, CALL)
    replies: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        for choice in ("none", "auto"):
            replies.append(
                await client.chat.completions.create(model=task.model, messages=ask(task), **options(choice))
            )
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    none, auto = replies
    assert "<tools>" not in tokenizer.decode(none.model_extra["prompt_token_ids"], skip_special=False)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content == CALL
    assert none.choices[0].finish_reason == "stop"
    assert "<tools>" in tokenizer.decode(auto.model_extra["prompt_token_ids"], skip_special=False)
    assert auto.choices[0].finish_reason == "tool_calls" and auto.choices[0].message.content is None
    assert group.episodes is not None and group.episodes.tool_calls == [1]


async def test_a_tool_choice_that_cannot_be_enforced_is_refused(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    refused: list[openai.BadRequestError] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        named = {"type": "function", "function": {"name": "add"}}
        for choice in ("required", named, "sometimes"):
            try:
                await client.chat.completions.create(model=task.model, messages=ask(task), **options(choice))
            except openai.BadRequestError as err:
                refused.append(err)
        await client.chat.completions.create(model=task.model, messages=ask(task))  # still served
        return 1.0

    group = await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1])
    assert [(err.status_code, err.param) for err in refused] == [(400, "tool_choice")] * 3
    assert [err.code for err in refused] == ["unsupported_value", "unsupported_value", None]
    assert "cannot be enforced" in refused[0].message and "'auto' or 'none'" in refused[1].message
    assert group.episodes is not None and group.episodes.turns == [1]


LLAMA3ISH = CHATML.replace(
    "message['role']", "('ipython' if message['role'] == 'tool' else message['role'])"
)  # results in Llama 3.1's role: the template of a "llama3" family


async def test_a_llama3_templates_calls_come_back_in_openai_form(tmp_path: Path) -> None:
    directory = byte_checkpoint(tmp_path / "llama3ish")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": LLAMA3ISH}))
    tokenizer = HFTokenizer(directory)
    scripted = Scripted(tokenizer, '{"name": "add", "parameters": {"a": 2, "b": 2}}')
    replies: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        replies.append(reply)
        (call,) = reply.choices[0].message.tool_calls or []
        messages += [reply.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "4"}]
        replies.append(await client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS))  # type: ignore[arg-type]
        return 1.0

    group = await play(agent, scripted, tokenizer, seeds=[1])
    first, second = replies
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 2}
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
    opening = tokenizer.decode(first.model_extra["prompt_token_ids"], skip_special=False)
    assert "Given the following functions" in opening and "<tools>" not in opening
    kept = first.model_extra["prompt_token_ids"] + scripted.ids  # the call's own ids go on
    assert second.model_extra["prompt_token_ids"][: len(kept)] == kept
    between = tokenizer.decode(second.model_extra["prompt_token_ids"][len(kept) :], skip_special=False)
    # the result as written, in environment.role (user), no <tool_response> around it
    assert between == "\n<|im_start|>user\n4<|im_end|>\n<|im_start|>assistant\n"
    assert group.episodes is not None and group.episodes.sequences == [1]


async def test_logprobs_in_openai_form_are_the_engines(checkpoint: Path) -> None:
    tokenizer = HFTokenizer(checkpoint)
    engine = recording_engine(checkpoint)
    replies: list[Any] = []
    refused: list[openai.BadRequestError] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        replies.append(
            await client.chat.completions.create(
                model=task.model, messages=ask(task), max_tokens=12, logprobs=True, n=2
            )
        )
        replies.append(
            await client.chat.completions.create(model=task.model, messages=ask(task), max_tokens=4)
        )
        try:
            await client.chat.completions.create(
                model=task.model, messages=ask(task), logprobs=True, top_logprobs=3
            )
        except openai.BadRequestError as err:
            refused.append(err)
        return 1.0

    await play(agent, EngineGenerate(engine), tokenizer, seeds=[7])
    asked, plain = replies
    for choice in asked.choices:
        ids, lps = choice.model_extra["token_ids"], choice.model_extra["token_logprobs"]
        entries = choice.logprobs.content
        assert [e.logprob for e in entries] == lps and len(ids) >= 1
        assert "".join(e.token for e in entries) == tokenizer.decode(ids, skip_special=False)
        assert all(e.bytes == list(e.token.encode()) and e.top_logprobs == [] for e in entries)
    assert plain.choices[0].logprobs is None
    (err,) = refused
    assert err.param == "top_logprobs" and err.code == "unsupported_value"


async def test_the_endpoint_on_a_unix_socket_serves_the_agents_client_and_its_own(checkpoint: Path) -> None:
    import httpx2

    tokenizer = HFTokenizer(checkpoint)
    seen: list[tuple[str, int, str]] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        reply = await client.chat.completions.create(model=task.model, messages=ask(task))
        transport = httpx2.AsyncHTTPTransport(uds=task.socket)  # a client of its own, as documented
        async with openai.AsyncOpenAI(
            base_url=str(client.base_url),
            api_key=client.api_key,
            http_client=httpx2.AsyncClient(transport=transport),
        ) as own:
            again = await own.chat.completions.create(model=task.model, messages=ask(task))
        folder = os.stat(os.path.dirname(task.socket)).st_mode & 0o777
        seen.append(
            (task.socket, folder, f"{reply.choices[0].message.content} {again.choices[0].message.content}")
        )
        return 1.0

    episodes = AgentEpisodes("tests:agent", agent, tokenizer, Bounds(), listen="unix")
    prompt = Prompt(3, "What is 2+2?", "4")
    (group,) = await episodes.run(
        Scripted(tokenizer, "ok"), [(prompt, [1], tokenizer.encode_prompt(prompt.text))], tokenizer.eos_id
    )
    ((socket, mode, said),) = seen
    assert socket.endswith("endpoint.sock") and mode == 0o700 and said == "ok ok"
    assert not os.path.exists(os.path.dirname(socket))  # removed with the batch
    assert group.episodes is not None and group.episodes.turns == [2]
