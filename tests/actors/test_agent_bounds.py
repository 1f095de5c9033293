"""Agent episodes within their bounds, and what the endpoint answers to what it does not serve: calls
past max_turns refused (the agent may still return its reward), an agent that raises or overruns its
time scored on_error, malformed requests answered with OpenAI's error body and the endpoint still
serving, a call after its episode refused, an engine failure raised once every agent has ended."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from structlog.testing import capture_logs

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.episodes import AgentTask
from cadence.rollout.play import EngineGenerate
from cadence.tasks.environments.bounds import Bounds
from tests.actors.test_agent_endpoint import Scripted, ask, play
from tests.agent_rig import byte_checkpoint, recording_engine

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    return HFTokenizer(byte_checkpoint(tmp_path_factory.mktemp("agent") / "ckpt"))


async def test_a_call_past_max_turns_is_refused_and_the_agent_keeps_its_reward(
    tokenizer: HFTokenizer,
) -> None:
    refused: list[openai.BadRequestError] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        messages: list[Any] = ask(task)
        try:
            for _ in range(3):
                reply = await client.chat.completions.create(model=task.model, messages=messages)
                messages += [reply.choices[0].message, {"role": "user", "content": "Go on."}]
        except openai.BadRequestError as err:
            refused.append(err)
        return 0.25

    with capture_logs() as logs:
        group = await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1], bounds=Bounds(max_turns=2))
    assert [err.code for err in refused] == ["max_turns"]
    (said,) = [e for e in logs if e["event"] == "agent_call_refused"]  # the worker's log says so too
    assert (said["status"], said["code"], said["log_level"]) == (400, "max_turns", "warning")
    assert said["path"] == "/v1/chat/completions" and said["reason"] == refused[0].body["message"]  # type: ignore[index]
    assert group.scores[0].reward == 0.25 and group.episodes is not None
    assert group.episodes.endings == ["max_turns"] and group.episodes.turns == [2]


async def test_an_agent_that_raises_or_overruns_is_scored_on_error_and_logged(tokenizer: HFTokenizer) -> None:
    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        await client.chat.completions.create(model=task.model, messages=ask(task))
        if task.seed == 1:
            raise RuntimeError("the agent's own bug")
        if task.seed == 2:
            await asyncio.Event().wait()  # never returns: past step_timeout_s after its call
        return 1.0

    bounds = Bounds(step_timeout_s=0.5, on_error=-1.0)
    with capture_logs() as logs:
        group = await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1, 2, 3], bounds=bounds)
    assert [s.reward for s in group.scores] == [-1.0, -1.0, 1.0]
    assert group.episodes is not None and group.episodes.endings == ["error", "episode_timeout", "done"]
    assert group.episodes.env_timeouts == [0, 1, 0]
    failed = [e for e in logs if e["event"] == "agent_failed"]
    assert len(failed) == 1 and failed[0]["seed"] == 1 and isinstance(failed[0]["exc_info"], RuntimeError)
    assert [e["seed"] for e in logs if e["event"] == "agent_timed_out"] == [2]


async def test_malformed_requests_get_openai_errors_and_the_endpoint_goes_on(tokenizer: HFTokenizer) -> None:
    answers: list[tuple[int, dict[str, Any]]] = []
    elsewhere: list[tuple[int, dict[str, Any]]] = []  # a route not served

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        url = f"{client.base_url}chat/completions"
        key = {"Authorization": f"Bearer {client.api_key}"}
        good = {"model": task.model, "messages": ask(task)}
        bodies: list[tuple[bytes | dict[str, Any], dict[str, str]]] = [
            (b"{not json", key),
            ({**good, "model": "gpt-4o"}, key),
            ({**good, "n": 99}, key),
            ({**good, "messages": ask(task, "x" * 600)}, key),  # past the model's 512 positions
            ({**good, "messages": [{"role": "wizard", "content": "hi"}]}, key),
            ({**good, "stream": True, "stream_options": "usage"}, key),
            ({**good, "temperature": 5}, key),  # past OpenAI's range
            ({**good, "tool_choice": 3}, key),
            ({**good, "top_logprobs": 2}, key),
            ({"messages": ask(task)}, key),
            (good, {"Authorization": "Bearer not-a-key"}),
            (good, key),
        ]
        async with aiohttp.ClientSession() as http:
            for body, headers in bodies:
                data = body if isinstance(body, bytes) else None
                sent = http.post(url, data=data, json=None if data else body, headers=headers)
                async with sent as got:
                    answers.append((got.status, await got.json()))
            async with http.post(f"{client.base_url}completions", json=good, headers=key) as got:
                elsewhere.append((got.status, await got.json()))
        return 1.0

    with capture_logs() as logs:
        group = await play(agent, Scripted(tokenizer, "ok", max_context=512), tokenizer, seeds=[1])
    statuses = [status for status, _ in answers]
    said = [e for e in logs if e["event"] == "agent_call_refused"]  # each refusal in the worker's log
    assert [(e["status"], e["code"]) for e in said] == [
        (status, body["error"]["code"]) for status, body in [*answers[:-1], *elsewhere]
    ]
    assert said[1]["param"] == "model" and "gpt-4o" in said[1]["reason"]
    assert statuses == [400, 404, 400, 400, 400, 400, 400, 400, 400, 400, 401, 200]
    for _, body in answers[:-1]:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    codes = [body["error"]["code"] for _, body in answers[:-1]]
    assert (
        codes[1] == "model_not_found"
        and codes[3] == "context_length_exceeded"
        and codes[10] == "invalid_api_key"
    )
    assert (
        answers[8][1]["error"]["param"] == "top_logprobs"
        and "stream_options" in answers[5][1]["error"]["message"]
    )
    assert (
        answers[2][1]["error"]["param"] == "n" and answers[-1][1]["choices"][0]["message"]["content"] == "ok"
    )
    assert group.scores[0].reward == 1.0 and group.episodes is not None and group.episodes.turns == [1]
    ((status, body),) = elsewhere
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


async def test_no_call_is_answered_after_its_episode_or_its_batch(tokenizer: HFTokenizer) -> None:
    kept: list[openai.AsyncOpenAI] = []
    left = asyncio.Event()
    refusals: list[Exception] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        if task.seed == 1:  # keeps its client and ends at once
            kept.append(
                openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
            )
            left.set()
            return 1.0
        await left.wait()
        deadline = asyncio.get_running_loop().time() + 10
        while asyncio.get_running_loop().time() < deadline:  # the first episode's end is now or soon
            try:
                await kept[0].chat.completions.create(model=task.model, messages=ask(task))
            except openai.AuthenticationError as err:
                refusals.append(err)
                break
            await asyncio.sleep(0.01)
        return 1.0

    await play(agent, Scripted(tokenizer, "ok"), tokenizer, seeds=[1, 2])
    assert len(refusals) == 1 and "ended" in str(refusals[0])
    with pytest.raises(openai.APIConnectionError):  # the batch is over: nothing serves its calls
        await kept[0].chat.completions.create(model="cadence", messages=[{"role": "user", "content": "hi"}])
    await kept[0].close()


async def test_a_version_change_under_the_batch_fails_its_calls_and_the_batch(tmp_path: Path) -> None:
    checkpoint = byte_checkpoint(tmp_path / "ckpt")
    tokenizer = HFTokenizer(checkpoint)
    loaded = {"version": 0}

    @contextlib.contextmanager
    def hold() -> Any:  # the worker's: refuses a generation once another version is loaded
        if loaded["version"] != 0:
            raise RuntimeError(f"episodes of version 0 would go on with {loaded['version']} loaded")
        yield

    statuses: list[int] = []

    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        loaded["version"] = 1
        try:
            await client.chat.completions.create(model=task.model, messages=ask(task), max_tokens=2)
        except openai.InternalServerError as err:
            statuses.append(err.status_code)
        return 1.0

    generate = EngineGenerate(recording_engine(checkpoint), hold=hold)
    with pytest.raises(RuntimeError, match="would go on with 1 loaded"):
        await play(agent, generate, tokenizer, seeds=[1])
    assert statuses == [500]


class Stuck:
    """A `Generate` that never answers (an engine stuck past the episode's time)."""

    max_context = 512

    async def __call__(self, prompts: Any, seeds: Any, max_new_tokens: Any) -> Any:
        await asyncio.Event().wait()


@pytest.mark.timeout(20)  # the endpoint waits for no answer that will not come (aiohttp's 60 s)
async def test_an_agent_past_its_time_inside_a_call_ends_and_the_batch_closes(tokenizer: HFTokenizer) -> None:
    async def agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
        await client.chat.completions.create(model=task.model, messages=ask(task))
        return 1.0

    bounds = Bounds(episode_timeout_s=0.5, on_error=-1.0)
    group = await play(agent, Stuck(), tokenizer, seeds=[1, 2], bounds=bounds)
    assert [s.reward for s in group.scores] == [-1.0, -1.0]
    assert group.episodes is not None and group.episodes.endings == ["episode_timeout"] * 2
