"""Shared fixtures: a tiny run configuration and in-process networks that are always closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import pytest

from cadence.config import RunConfig, load_config
from cadence.transport.endpoint import Client, Server
from cadence.transport.inproc import InprocClient, InprocNetwork
from cadence.wire.messages import (
    Envelope,
    EpisodeFigures,
    EvalResult,
    GroupResult,
    Heartbeat,
    Message,
    Register,
)
from cadence.wire.roles import SIGNED, sign

M = TypeVar("M", bound=Message)


class TrainerClient(InprocClient):
    """A test's trainer talking to the dispatcher: its word (`roles.SIGNED`) signed with `key`, as a
    trainer's session signs it."""

    def __init__(self, network: InprocNetwork, name: str, address: str, key: str) -> None:
        super().__init__(network, name, address)
        self.key = key

    async def send(self, msg: Message) -> None:
        await super().send(sign(self.key, msg) if msg.TAG in SIGNED else msg)


async def join(network: InprocNetwork, name: str, role: str, address: str = "") -> InprocClient:
    """A client registered at `inproc://dispatcher` as `role` (a trainer with the key `key-of-<name>`)."""
    if role == "trainer":
        client: InprocClient = TrainerClient(network, name, "inproc://dispatcher", f"key-of-{name}")
    else:
        client = network.connect(name, "inproc://dispatcher")
    await client.send(Register(role, address, key=f"key-of-{name}" if role == "trainer" else ""))
    return client


def tiny_config(*overrides: str) -> RunConfig:
    """A run small enough for a test: 3 periods of 4 prompts, 4 samples each, fast heartbeats."""
    base = [
        "periods=3",
        "task.prompts_per_period=4",
        "rollout.group_size=4",
        "rollout.workers=1",
        "model.hidden_size=32",
        "model.intermediate_size=64",
        "transport.heartbeat_s=0.05",
        "transport.liveness=10",
        "run_id='test'",
    ]
    return load_config(None, [*base, *overrides])


@pytest.fixture
def network() -> Iterator[InprocNetwork]:
    net = InprocNetwork(run="test")
    yield net
    net.close()


async def expect(endpoint: Client | Server, kind: type[M], timeout: float = 5.0, skip: Any = ()) -> M:
    """The next message of type `kind` on `endpoint` (skipping heartbeats and `skip` types)."""

    async def next_one() -> M:
        while True:
            got = await endpoint.recv()
            env: Envelope = got if isinstance(got, Envelope) else got[1]
            if isinstance(env.message, kind):
                return env.message
            # a session's Register again, sent in its heartbeat's place until it hears the dispatcher
            if isinstance(env.message, (Heartbeat, Register, *skip)):
                continue
            raise AssertionError(f"expected {kind.__name__}, got {env.message!r}")

    return await asyncio.wait_for(next_one(), timeout)


def keep_beating(clients: Sequence[Client]) -> asyncio.Task[None]:
    """Heartbeats from every client in `clients` (the list may grow) until the task is cancelled."""

    async def beat() -> None:
        while True:
            for client in list(clients):
                await client.send(Heartbeat("test"))
            await asyncio.sleep(0.05)

    return asyncio.create_task(beat())


def scored(
    prompt_id: int,
    completions: list[list[int]],
    rewards: list[float],
    correct: list[float],
    gen_s: float = 0.0,
    load_s: float = 0.0,
    parts: dict[str, list[float]] | None = None,
) -> GroupResult:
    """A single-turn group of period 0 as a worker sends it, with these samples and figures."""
    return GroupResult(
        period=0,
        version=0,
        prompt_id=prompt_id,
        prompt_tokens=[1],
        completions=completions,
        logprobs=[[0.0] * len(c) for c in completions],
        rewards=rewards,
        correct=correct,
        gen_s=gen_s,
        load_s=load_s,
        finished_at=0.0,
        reward_parts=parts or {},
    )


def episodes_of(msg: GroupResult | EvalResult) -> EpisodeFigures:
    """The episode figures of a multi-turn group or eval answer (which must have them)."""
    assert msg.episodes is not None, f"{msg.TAG} without episode figures"
    return msg.episodes
