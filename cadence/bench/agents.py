"""`cadence bench agents`: what the agent endpoint costs beside the engine. N agents each make
`calls` calls of a growing conversation (`cadence/rollout/agent/`) through the real `openai` client
and the loopback endpoint, against an engine that answers at once (what the HTTP, the client, the
rendering and the tracing cost) and against a tiny random model on the built-in engine. Measured:
the batch's wall seconds, the engine's share of them, engine calls and rows a call (how well the
calls were gathered), and a call's seconds from its arrival to its answer.

Invariant: nothing is asserted; the figures are printed.
"""

from __future__ import annotations

import asyncio
import os
import string
import time
from collections.abc import Sequence
from typing import Any

from cadence.bench.report import report
from cadence.model.config import ModelConfig
from cadence.model.engine import SamplingParams, TorchEngine
from cadence.model.rollout_engine import TorchRolloutEngine
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.rollout.agent.episodes import AgentEpisodes
from cadence.rollout.play import EngineGenerate
from cadence.tasks.base import Prompt
from cadence.tasks.environments.bounds import Bounds
from cadence.tasks.environments.generation import Generate, Generated

CALLS = 4


class _Instant:
    """Answers every row at once with `ids`."""

    def __init__(self, ids: list[int]) -> None:
        self.ids, self.max_context = ids, 4096

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        return [Generated(self.ids, [-0.5] * len(self.ids), True) for _ in prompts]


class _Timed:
    def __init__(self, generate: Generate) -> None:
        self.generate, self.max_context = generate, generate.max_context
        self.calls, self.rows, self.seconds = 0, 0, 0.0

    async def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: Sequence[int]
    ) -> list[Generated]:
        start = time.perf_counter()
        out = await self.generate(prompts, seeds, max_new_tokens)
        self.calls, self.rows, self.seconds = (
            self.calls + 1,
            self.rows + len(prompts),
            self.seconds + time.perf_counter() - start,
        )
        return out


async def _agent(client: Any, task: Any) -> float:
    messages: list[Any] = [{"role": "user", "content": task.prompt}]
    for _ in range(CALLS):
        reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
        messages += [reply.choices[0].message, {"role": "user", "content": "More."}]
    return 1.0


async def _measure(generate: Generate, tokenizer: CharTokenizer, agents: int) -> dict[str, float]:
    timed = _Timed(generate)
    episodes = AgentEpisodes("bench", _agent, tokenizer, Bounds(max_turns=CALLS, max_turn_tokens=8))
    prompt = Prompt(1, "What is 2+2?", "4")
    start = time.perf_counter()
    groups = [(prompt, list(range(1, agents + 1)), tokenizer.encode_prompt(prompt.text))]
    (group,) = await episodes.run(timed, groups, tokenizer.eos_id)
    wall = time.perf_counter() - start
    assert group.episodes is not None
    calls = sum(group.episodes.turns)
    return {
        "wall_s": round(wall, 3),
        "engine_share": round(timed.seconds / wall, 3),
        "engine_calls": timed.calls,
        "engine_rows": timed.rows,
        "rows_per_engine_call": round(timed.rows / max(timed.calls, 1), 1),
        "call_ms_mean": round(sum(group.episodes.call_s) / max(calls, 1) * 1e3, 2),
        "non_engine_ms_per_call": round((wall - timed.seconds) / max(calls, 1) * 1e3, 3),
    }


def bench_agents(as_json: bool, agents: Sequence[int] = (1, 16, 64)) -> int:
    tokenizer = CharTokenizer("".join(c for c in string.printable if c not in "\t\r\x0b\x0c"))
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, max_position=1024
    )
    engine = TorchRolloutEngine(TorchEngine(init_model(cfg, 0), tokenizer.eos_id), SamplingParams(8))
    result: dict[str, Any] = {"bench": "agents", "calls_an_agent": CALLS, "load_avg": list(os.getloadavg())}
    makers: tuple[tuple[str, Generate], ...] = (
        ("instant", _Instant(tokenizer.encode("ok") + [tokenizer.eos_id])),
        ("tiny", EngineGenerate(engine)),
    )
    for name, generate in makers:
        for n in agents:
            for key, value in asyncio.run(_measure(generate, tokenizer, n)).items():
                result[f"{name}_{n}_{key}"] = value
    return report(result, as_json)
