"""Weights broadcast from the trainer to the rollout workers through a torch.distributed group.

```
 worker ── BroadcastJoin ─► publisher (root) ── BroadcastJoined(from_version) ─► worker
 trainer publishes k ─► root: roster changed since the last group (join, loss)? new generation
                     ─► BroadcastPlan(k, generation, rank, layout) to every member (ZeroMQ)
                     ─► [form the group] ─► buckets by broadcast ─► digest and done keys (store)
 member: plan ─► [form the group] ─► receive buckets ─► check digest ─► version k ready
 any step out of time or broken ─► root drops who did not finish; members that failed join again
                                   and pull that version over ZeroMQ instead
```

Workers that join mid-period pull the current version over ZeroMQ and are in the group from the
next version on. The broadcast is an accelerator beside the pull, never a replacement: whatever goes
wrong with it, a worker still gets its version, checksummed, from the publisher's store.

Invariant: a member hands out a version's tensors only when every bucket arrived and (on CPU
buffers) their xxh3-128 digest equals the root's; the root's group always holds exactly the roster it
planned, and a member that did not finish a version is out of the roster until it joins again.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
import torch.distributed as dist
import xxhash
from torch import Tensor

from cadence.config.devices import DEVICES
from cadence.log import one_line
from cadence.transport.buckets import BucketPlan, plan_buckets, plan_from_layout
from cadence.transport.endpoint import Client, Server
from cadence.transport.process_groups import (
    BroadcastError,
    connect_store,
    host_store,
    member_rendezvous,
    new_group,
    receive_buckets,
    root_rendezvous,
    send_buckets,
    wait_keys,
)
from cadence.wire.messages import BroadcastDropped, BroadcastJoin, BroadcastJoined, BroadcastPlan, Message

log = structlog.get_logger()

BROKEN = "broken"  # the digest key's value when the root's send of a version failed


def _hasher(device: str) -> tuple[Any, Callable[[Tensor], None] | None]:
    """The xxh3-128 of CPU buffers (as pulls check); on a device the bytes are not copied back to be
    hashed."""
    if device != "cpu":
        return None, None
    hasher = xxhash.xxh3_128()
    return hasher, lambda buffer: hasher.update(buffer.numpy())


class BroadcastRoot:
    """Rank 0, inside the publisher of the trainer's process: the roster, its generations, the sends."""

    def __init__(
        self,
        server: Server,
        backend: str,
        host: str,
        advertise_host: str,
        port: int,
        bucket_bytes: int,
        timeout_s: float,
        prefix: str,
    ) -> None:
        self.server = server
        self.backend = backend
        self.device = DEVICES[backend]
        self.host = advertise_host or host
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.prefix = prefix
        self.store = host_store(host, port, timeout_s)
        self.members: dict[str, bytes] = {}  # name ─► its route on the server, in join order
        self._joins: dict[str, int] = {}  # name ─► the join count when it (last) joined
        self._join_count = 0
        self.roster: list[str] = []  # the members of the current group, rank i + 1 each
        self.group: Any = None
        self._reform = False
        self.generation = 0
        self.latest = -1

    def join(self, peer: bytes, name: str) -> BroadcastJoined:
        """Take `name` in (again): its broadcasts start with the next version published."""
        self._join_count += 1
        self._joins[name] = self._join_count
        self.members[name] = peer
        if name in self.roster:  # it lost the group: the next version forms a new one
            self._reform = True
        log.info("broadcast_member_joined", member=name, from_version=self.latest + 1)
        return BroadcastJoined(self.latest + 1)

    async def broadcast(self, version: int, state: Mapping[str, Tensor]) -> bool:
        """Send `version` to every member; False (logged, members dropped) when it did not reach all."""
        self.latest = version
        roster = list(self.members)
        joins_before = self._join_count
        if roster != self.roster or self.group is None or self._reform:
            self.group, self.roster, self._reform = None, roster, False
            self.generation += 1
        if not roster:
            return False
        plan = plan_buckets(state, self.bucket_bytes)
        prefix = f"{self.prefix}/g{self.generation}/"
        for rank, name in enumerate(roster, start=1):
            await self.server.send(self.members[name], self._plan(version, rank, prefix, plan))
        begin = time.monotonic()
        try:
            await asyncio.to_thread(self._send, version, prefix, plan, state)
        except Exception as err:  # whatever broke, the workers still pull this version
            missing = err.missing if isinstance(err, BroadcastError) else range(1, len(roster) + 1)
            names = [roster[r - 1] for r in missing if 0 < r <= len(roster)]
            for name in names:  # unless it joined again meanwhile; if it is alive, it joins again
                if self._joins.get(name, 0) <= joins_before and name in self.members:
                    await self.server.send(self.members.pop(name), BroadcastDropped(version))
            self.group = None
            log.warning(
                "broadcast_failed",
                version=version,
                generation=self.generation,
                missing=names,
                error=one_line(err),
                exc_info=True,
            )
            return False
        log.info(
            "weights_broadcast",
            version=version,
            generation=self.generation,
            members=roster,
            nbytes=plan.nbytes,
            seconds=round(time.monotonic() - begin, 4),
        )
        return True

    def _plan(self, version: int, rank: int, prefix: str, plan: BucketPlan) -> BroadcastPlan:
        return BroadcastPlan(
            version=version,
            generation=self.generation,
            rank=rank,
            world=len(self.roster) + 1,
            backend=self.backend,
            store_host=self.host,
            store_port=self.store.port,
            prefix=prefix,
            timeout_s=self.timeout_s,
            names=[s.name for s in plan.slots],
            dtypes=[s.dtype for s in plan.slots],
            shapes=[list(s.shape) for s in plan.slots],
            buckets=[s.bucket for s in plan.slots],
            offsets=[s.offset for s in plan.slots],
            sizes=list(plan.sizes),
        )

    def _send(self, version: int, prefix: str, plan: BucketPlan, state: Mapping[str, Tensor]) -> None:
        """In a thread: [form the group,] send every bucket, wait for every member's confirmation.
        A broken send still waits for the confirmations, so the error names who did not finish."""
        store = dist.PrefixStore(prefix, self.store)
        world = len(self.roster) + 1
        if self.group is None:
            root_rendezvous(store, world, self.timeout_s)
        hasher, digest = _hasher(self.device)
        broken: Exception | None = None
        try:
            if self.group is None:
                self.group = new_group(self.backend, store, 0, world, self.timeout_s, self.host)
            send_buckets(self.group, plan, state, self.device, self.timeout_s, digest)
        except RuntimeError as err:  # a member went away while forming or sending: find out which
            broken = err
        # the digest a member checks its buckets against: empty on device buffers, BROKEN after a failed send
        sent = "" if hasher is None else hasher.hexdigest()
        store.set(f"digest/{version}", BROKEN if broken is not None else sent)
        missing = wait_keys(store, {r: f"done/{version}/{r}" for r in range(1, world)}, self.timeout_s)
        if missing or broken is not None:
            cause = f": {broken}" if broken is not None else ""
            raise BroadcastError(
                f"ranks {missing} did not confirm version {version}{cause}", missing
            ) from broken


def _local_host(remote: str, port: int) -> str:
    """This host's address on the route to `remote` (the interface a group member binds to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((remote, port))
        return str(probe.getsockname()[0])


def _layout(msg: BroadcastPlan) -> BucketPlan:
    return plan_from_layout(msg.names, msg.dtypes, msg.shapes, msg.buckets, msg.offsets, msg.sizes)


MEMBER_TAKES: tuple[type[Message], ...] = (BroadcastJoined, BroadcastDropped, BroadcastPlan)
"""What a member takes from the publisher (`BroadcastMember.run`)."""


class BroadcastMember:
    """A rollout worker's side: joins, receives each planned version, hands it to the worker."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.from_version: int | None = None
        self._outcomes: dict[int, asyncio.Future[dict[str, Tensor] | None]] = {}
        self._store: Any = None
        self._store_at: tuple[str, int] | None = None
        self._group: Any = None
        self._generation = 0

    async def run(self, client: Client) -> None:
        await client.send(BroadcastJoin(self.worker))
        while True:
            env = await client.recv()
            msg = env.message
            if isinstance(msg, BroadcastJoined):
                self.from_version = msg.from_version
                log.info("broadcast_joined", from_version=msg.from_version)
            elif isinstance(msg, BroadcastDropped):
                self.from_version, self._group = None, None
                log.warning("broadcast_dropped", version=msg.version)
                await client.send(BroadcastJoin(self.worker))
            elif isinstance(msg, BroadcastPlan):
                state: dict[str, Tensor] | None = None
                try:
                    state = await asyncio.to_thread(self._receive, msg)
                except Exception as err:  # a broken group or a plan that does not fit: pull instead
                    self._group = None
                    log.warning(
                        "broadcast_failed",
                        version=msg.version,
                        generation=msg.generation,
                        error=one_line(err),
                        exc_info=True,
                    )
                    await client.send(BroadcastJoin(self.worker))
                self._settle(msg.version, state)
            else:
                log.warning("unexpected_message", peer=env.sender, type=msg.TAG)

    async def weights(self, version: int, wait_s: float) -> dict[str, Tensor] | None:
        """The tensors of `version` once broadcast; None when this worker is not in that broadcast
        (joined later, it failed, or nothing came within `wait_s`): then pull it."""
        if self.from_version is None or version < self.from_version:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(self._future(version)), wait_s)
        except TimeoutError:
            log.warning("broadcast_missed", version=version, waited_s=wait_s)
            return None

    def _future(self, version: int) -> asyncio.Future[dict[str, Tensor] | None]:
        if version not in self._outcomes:
            self._outcomes[version] = asyncio.get_running_loop().create_future()
        return self._outcomes[version]

    def _settle(self, version: int, state: dict[str, Tensor] | None) -> None:
        future = self._future(version)
        if not future.done():
            future.set_result(state)
        for old in [v for v in self._outcomes if v < version]:
            del self._outcomes[old]

    def _receive(self, msg: BroadcastPlan) -> dict[str, Tensor]:
        if self._store_at != (msg.store_host, msg.store_port):
            self._store = connect_store(msg.store_host, msg.store_port, msg.timeout_s)
            self._store_at = (msg.store_host, msg.store_port)
        store = dist.PrefixStore(msg.prefix, self._store)
        if self._group is None or msg.generation != self._generation:
            self._group = None
            member_rendezvous(store, msg.rank, msg.timeout_s)
            host = _local_host(msg.store_host, msg.store_port)
            self._group = new_group(msg.backend, store, msg.rank, msg.world, msg.timeout_s, host)
            self._generation = msg.generation
            log.info("broadcast_group_formed", generation=msg.generation, rank=msg.rank, world=msg.world)
        device = DEVICES[msg.backend]
        hasher, digest = _hasher(device)
        state = receive_buckets(self._group, _layout(msg), device, msg.timeout_s, digest)
        expected = store.get(f"digest/{msg.version}").decode()
        if expected == BROKEN:
            raise BroadcastError(f"version {msg.version}: the root's send broke off", [0])
        if hasher is not None and expected and hasher.hexdigest() != expected:
            raise BroadcastError(f"version {msg.version} failed its checksum", [msg.rank])
        store.set(f"done/{msg.version}/{msg.rank}", "1")
        return state
