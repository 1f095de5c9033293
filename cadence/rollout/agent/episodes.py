"""Agent episodes (`environment.agent`): each sample is a user's `async def agent(client, task)` run
against the worker's endpoint, its return value the sample's reward, its calls the sample's tokens.

```
 run(generate, groups): an Endpoint on loopback and a Batcher on `generate` for the batch
   each (prompt, seed): a key ─► agent(AsyncOpenAI(base_url, key), AgentTask) under the episode's time
     (episode_timeout_s in all; step_timeout_s for the agent's own time between calls)
     returned a number or a Score ─► its reward; raised, timed out, or a wrong value ─► on_error, logged
     ─► key ended (no call answered after this) ─► its trace's sequences, each a row of its sample
   groups: scores, texts and figures as `play.episode_group` makes them, with the calls' figures; the
     prompt every row's first prompt begins with; each episode's sequences its rows (`episode_of`)
```

Invariant: every episode given comes back, in order, scored; no call is answered once its episode has
ended or the batch has returned; the engine's failure (or a version change under `hold`) is raised
once every agent has ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import structlog

from cadence.model.tokenizer import TextTokenizer
from cadence.monitor.span import Overlapping
from cadence.rollout.agent.batcher import Batcher
from cadence.rollout.agent.calls import EpisodeCalls, Serving
from cadence.rollout.agent.sampling import Sampling
from cadence.rollout.agent.server import Endpoint
from cadence.rollout.agent.trace import Node, Renderer, Trace
from cadence.rollout.play import EngineGenerate, episode_group, row_after, shared_prompt
from cadence.rollout.results import GroupSamples
from cadence.tasks.base import Prompt, Score
from cadence.tasks.environments.base import Author, Ending, Turn
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.episode_record import EpisodeResult
from cadence.tasks.environments.generation import Generate
from cadence.wire.rows import per_sample

log = structlog.get_logger()


@dataclass(frozen=True)
class AgentTask:
    """What an agent is given beside its client: the task's row and the model name to call."""

    prompt: str
    answer: str
    prompt_id: int
    seed: int
    model: str
    socket: str = ""  # the endpoint's Unix socket (environment.agent_listen = "unix"), else ""


Agent = Callable[[Any, AgentTask], Awaitable[object]]


@dataclass(frozen=True)
class AgentEpisodes:
    """What a worker needs to run an assignment's samples as agent episodes."""

    name: str  # the agent's "package.module:function"
    agent: Agent
    tokenizer: TextTokenizer
    bounds: Bounds
    model: str = "cadence"
    max_choices: int = 4
    tool_role: str = "user"
    gather_s: float = 0.003
    clock: Callable[[], float] = time.monotonic
    sampling: Sampling = Sampling()  # the run's temperature and top_p, and what a call asking others gets
    listen: Literal["loopback", "unix"] = "loopback"  # where the endpoint is served

    async def run(
        self,
        generate: Generate,
        groups: Sequence[tuple[Prompt, list[int], list[int]]],
        eos_id: int,
        waits: Overlapping | None = None,
        version: int = 0,
    ) -> list[GroupSamples]:
        """Every (prompt, sample seeds, fallback prompt ids) group's episodes, one a seed, together, on
        `generate` (which holds weights `version`, the responses' `cadence.version`)."""
        pairs = [(prompt, seed) for prompt, seeds, _ in groups for seed in seeds]
        live = [len(pairs)]
        clock = waits.clock if waits is not None else self.clock  # the worker's, for its spans
        batcher = Batcher(generate, lambda: live[0], self.gather_s, clock, self.bounds.max_turn_tokens)
        spans = dict(waits.fields) if waits is not None else None
        serving = Serving(
            batcher,
            self.tokenizer,
            self.bounds,
            generate.max_context,
            self.max_choices,
            version,
            self.model,
            clock,
            spans,
            self._sampling(generate),
        )
        endpoint = Endpoint(self.model, unix=self.listen == "unix")
        serve = asyncio.ensure_future(batcher.run())
        clients = None
        try:
            clients = _Clients(endpoint, await endpoint.start(), self.bounds.episode_timeout_s)

            async def one(prompt: Prompt, seed: int) -> tuple[EpisodeResult, EpisodeCalls]:
                try:
                    return await self._episode(clients, serving, prompt, seed)
                finally:
                    live[0] -= 1
                    batcher.poke()

            results = await asyncio.gather(*(one(prompt, seed) for prompt, seed in pairs))
        finally:
            serve.cancel()
            batcher.close()
            if clients is not None:
                await clients.base.close()
            await endpoint.close()
            if waits is not None:
                waits.close()
        if batcher.failure is not None:
            raise batcher.failure
        out, start = [], 0
        for _, seeds, fallback in groups:
            out.append(_group(results[start : start + len(seeds)], fallback, eos_id))
            start += len(seeds)
        return out

    def _sampling(self, generate: Generate) -> Sampling:
        """What `generate` samples at: an eval batch's temperature where it has one, else the run's."""
        if isinstance(generate, EngineGenerate) and generate.temperature is not None:
            return dataclasses.replace(self.sampling, temperature=generate.temperature)
        return self.sampling

    async def _episode(
        self, clients: _Clients, serving: Serving, prompt: Prompt, seed: int
    ) -> tuple[EpisodeResult, EpisodeCalls]:
        """One agent's episode, from its key to its result."""
        started = serving.clock()
        calls = EpisodeCalls(
            serving,
            Trace(Renderer(self.tokenizer, self.tool_role)),
            seed,
            deadline=started + self.bounds.episode_timeout_s,
            idle_since=started,
        )
        key = clients.endpoint.open(calls)
        client = clients.base.with_options(api_key=key)  # the batch's connections, the episode's key
        task = AgentTask(
            prompt.text, prompt.answer, prompt.prompt_id, seed, self.model, clients.endpoint.socket
        )
        which = {"agent": self.name, "prompt_id": prompt.prompt_id, "seed": seed}
        try:
            ending, value, timeouts = await _watched(
                self.agent(client, task), calls, self.bounds, serving.clock, which
            )
        finally:
            clients.endpoint.end(key)
        score = _score(value, which) if ending == "done" else None
        if score is None:
            ending = "error" if ending == "done" else ending
            score = Score(reward=self.bounds.on_error, correct=0.0, parts={"agent": self.bounds.on_error})
        own_s = max(0.0, serving.clock() - started - calls.seconds)
        return _result(prompt, seed, calls, score, calls.bound or ending, timeouts, own_s), calls


class _Clients:
    """The batch's endpoint, and one OpenAI client of it whose connections every episode's client
    shares (a client of its own each would make an SSL context each: 20 ms), through the endpoint's
    Unix socket where it has one."""

    def __init__(self, endpoint: Endpoint, base_url: str, timeout_s: float) -> None:
        import httpx2
        import openai

        self.endpoint = endpoint
        http = None
        if endpoint.socket:
            transport = httpx2.AsyncHTTPTransport(uds=endpoint.socket)
            http = openai.DefaultAsyncHttpxClient(transport=transport, timeout=timeout_s)
        self.base = openai.AsyncOpenAI(
            base_url=base_url, api_key="-", max_retries=0, timeout=timeout_s, http_client=http
        )


async def _watched(
    agent: Awaitable[object],
    calls: EpisodeCalls,
    bounds: Bounds,
    clock: Callable[[], float],
    which: dict[str, object],
) -> tuple[Ending, object, int]:
    """Run the agent within the episode's time and, outside its calls, the step timeout: (its ending,
    its value, timeouts); a failure is logged with its traceback."""
    task = asyncio.ensure_future(agent)
    try:
        while not task.done():
            now = clock()
            left = calls.deadline - now
            if calls.in_call == 0:
                left = min(left, calls.idle_since + bounds.step_timeout_s - now)
            if left <= 0:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
                past = clock() >= calls.deadline
                log.warning("agent_timed_out", **which, calls=calls.calls, past_episode=past)
                return "episode_timeout", None, 1
            calls.activity.clear()
            waiting = asyncio.ensure_future(calls.activity.wait())
            await asyncio.wait({task, waiting}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
    except BaseException:  # the batch was cancelled (its period stopped, the worker rejoined)
        task.cancel()
        raise
    try:
        return "done", task.result(), 0
    except Exception as exc:
        log.warning(
            "agent_failed", **which, calls=calls.calls, error=f"{type(exc).__name__}: {exc}", exc_info=exc
        )
        return "error", None, 0


def _score(value: object, which: dict[str, object]) -> Score | None:
    """The agent's value as a score: a finite number (its reward, correct when positive) or a Score of
    finite numbers; None, logged, for anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return Score(reward=float(value), correct=float(value > 0), parts={"agent": float(value)})
    if isinstance(value, Score) and all(
        isinstance(v, int | float) and math.isfinite(v)
        for v in (value.reward, value.correct, *value.parts.values())
    ):
        return value
    log.warning(
        "agent_failed", **which, error=f"the agent returned {value!r}, not a finite number or a Score"
    )
    return None


def _result(
    prompt: Prompt, seed: int, calls: EpisodeCalls, score: Score, ending: Ending, timeouts: int, own_s: float
) -> EpisodeResult:
    node = calls.trace.kept()
    ids, cut = (node.ids, node.prompt) if node is not None else ([], 0)
    said = node.said if node is not None else ()
    turns: list[Turn] = []
    for message in said:  # the messages between two answers as one environment turn
        author: Author = "model" if message.role == "assistant" else "environment"
        if turns and author == "environment" == turns[-1].author:
            turns[-1] = Turn(author, f"{turns[-1].text}\n\n{message.content}", 0)
        else:
            turns.append(Turn(author, message.content, 0))
    return EpisodeResult(
        prompt_id=prompt.prompt_id,
        seed=seed,
        prompt_tokens=ids[:cut],
        tokens=ids[cut:],
        mask=node.mask if node is not None else [],
        logprobs=node.logprobs if node is not None else [],
        turns=turns,
        turn_rewards=[],
        score=score,
        ended=ending,
        finished=node.finished if node is not None else False,
        tool_calls=calls.tool_calls,
        tool_errors=0,
        timeouts=timeouts,
        env_seconds=own_s,
        env_tokens=(node.mask.count(0) if node is not None else 0),
    )


def _group(
    results: Sequence[tuple[EpisodeResult, EpisodeCalls]], fallback: list[int], eos_id: int
) -> GroupSamples:
    """The episodes as a group: each episode's sequences its rows, after the prompt every row's first
    prompt begins with (what a row's own has beyond it: mask 0); scores, texts and figures as
    `play.episode_group` makes them, with the calls' own: turns are calls, and each episode's
    sequences, sampled tokens and seconds in calls, its environment tokens its rows' zeros."""
    group = episode_group([r for r, _ in results], fallback, eos_id)
    calls = [c for _, c in results]
    lines = [c.trace.sequences() for c in calls]
    heads = [node.ids[: node.prompt] for line in lines for node in line]
    prompt = shared_prompt(heads) if heads else group.prompt
    if not prompt:
        raise ValueError("the sequences of a group share no first token: their first messages differ")
    completions, masks, logprobs, episode_of = [], [], [], []
    for index, line in enumerate(lines):
        nodes: list[Node | None] = [*line] or [None]  # no answer: one row of eos, trained on nothing
        for node in nodes:
            head, ids = (node.ids[: node.prompt], node.ids[node.prompt :]) if node else ([], [])
            mask, lps = (node.mask, node.logprobs) if node else ([], [])
            tokens, mask, lps = row_after(prompt, head, ids, mask, lps, eos_id)
            completions.append(tokens)
            masks.append(mask)
            logprobs.append(lps)
            episode_of.append(index)
    assert group.episodes is not None
    figures = msgspec.structs.replace(
        group.episodes,
        turns=[c.calls for c in calls],
        env_tokens=per_sample([m.count(0) for m in masks], episode_of, len(calls)),
        sequences=[len(line) for line in lines],
        call_tokens=[c.tokens for c in calls],
        call_s=[c.seconds for c in calls],
    )
    split = len(episode_of) > len(calls)
    return GroupSamples(
        prompt,
        completions,
        logprobs,
        group.texts,
        group.scores,
        masks,
        figures,
        episode_of=episode_of if split else [],
    )
