"""A rollout worker with an agent (`environment.agent`), a real publisher and a tiny real model; the test
plays dispatcher and trainer. Each sample is one run of the agent against the worker's endpoint: the
group the trainer gets is the agent's calls as one sequence a sample, meaningful on the wire."""

from __future__ import annotations

import dataclasses

import pytest
from structlog.testing import capture_logs

from cadence.launch.build import make_engine, make_learner, make_tokenizer, vocab_limit
from cadence.launch.settings import group_bounds
from cadence.transport.inproc import InprocNetwork
from cadence.wire.meaning import group_problem
from cadence.wire.messages import Assignment, GroupResult, decode_frames, encode_frames
from tests.conftest import episodes_of, expect, tiny_config
from tests.worker_rig import welcomed_worker

pytestmark = pytest.mark.timeout(90)


async def test_a_worker_plays_an_assignment_as_agent_episodes(network: InprocNetwork) -> None:
    cfg = tiny_config(
        "model.max_position=384",
        "environment.agent='tests.system.tiny_agent:agent'",
        "environment.max_tokens=96",
        "environment.max_turn_tokens=8",
        "monitor.samples_fraction=1.0",
        "transport.liveness=200",
    )
    tokenizer = make_tokenizer(cfg)
    engine = make_engine(cfg, tokenizer)
    weights = make_learner(cfg, tokenizer).weights()
    with capture_logs() as logs:
        async with welcomed_worker(cfg, network, engine, weights, chunk_bytes=1 << 16) as w:
            await w.dispatcher.send(w.peers["rollout"], Assignment(0, 0, 7, "12", "2", 4))
            result = await expect(w.trainer, GroupResult, timeout=60)
    calls = [e for e in logs if e["event"] == "span" and e["kind"] == "call"]
    assert len(calls) == 8 and all(e["period"] == 0 and e["end"] >= e["start"] for e in calls)
    got = decode_frames(encode_frames(result, "w0", "test")).message
    assert isinstance(got, GroupResult)
    bounds = dataclasses.replace(group_bounds(cfg, vocab_limit(cfg, tokenizer)), samples=4)
    assert group_problem(got, bounds) is None
    figures = episodes_of(got)
    assert figures.turns == [2] * 4 and figures.sequences == [1] * 4 and figures.endings == ["done"] * 4
    assert got.prompt_tokens == tokenizer.encode_prompt("user: 12\n\nassistant: ")
    for tokens, mask in zip(got.completions, got.masks, strict=True):
        assert (
            len(tokens) == len(mask) and 2 <= sum(mask) <= 8 and 0 in mask and mask[0] == 1 and mask[-1] == 1
        )
    assert set(got.rewards) <= {0.0, 1.0}
