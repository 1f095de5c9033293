"""A rollout worker's weights: the version its engine holds, fetched and loaded when a batch names another.

```
 ensure(job) ─► job.version loaded? ─► nothing to do
             ─► this worker in the version's broadcast (weights.transport) ─► its tensors ─► load_state
             ─► the publisher offers it on this worker's GPU (transport/device_memory.py) ─► open its
                buffer (CUDA IPC), check the device digest ─► its tensors loaded, a copy on the device
                (or the engine computes with them); the buffer held until the next version is loaded
                (asked with `device`: a version the trainer announced from its GPU before its host
                bytes are in is answered with the buffer alone; failing it, asked again, answered
                once they are in)
             ─► the publisher on this host shares it (transport/shared_memory.py) ─► map its slot,
                check the digest ─► the engine computes with the mapped tensors (made once a
                mapping: model/mapping_views.py), in the same thread; the slot held
                until the next version is loaded (a slot refused: pulled instead; no sharing
                possible: one shared_memory_fallback line, pulled from then on)
             ─► else pull (transport/weights.py: checked chunks; the publisher's ipc:// address on its
                host) into a buffer of the pool ─► load ─► the buffer back to the pool
 turn(v)     ─► the engine to the calling thread alone, with the worker's thread budget (the cores
                the trainer leaves while it waits, where the engine computes alike with them:
                measured at the first computation; in periodic mode looked at again between two
                decode steps, by the trainer's activity); refused unless v is loaded
```

Invariant: one thread at a time computes on the engine; no version is loaded while a batch is made
with another (`playing`), and a generation runs only with the version it names loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import structlog

from cadence.model.checkpoint import state_dict_from_bytes, state_nbytes
from cadence.model.device_image import image_views
from cadence.model.lora_engine import LoraRolloutEngine
from cadence.model.mapping_views import MappingViews
from cadence.model.rollout_engine import RolloutEngine, ThreadedEngine, TorchRolloutEngine
from cadence.monitor.span import span
from cadence.transport.activity import ActivityReader
from cadence.transport.buffers import BufferPool
from cadence.transport.device_memory import DeviceReader, HeldBuffer, device_sharing_problem
from cadence.transport.endpoint import Client
from cadence.transport.heartbeat import Liveness
from cadence.transport.shared_memory import (
    Mapped,
    SharedError,
    SharedReader,
    SharingImpossible,
    sharing_problem,
)
from cadence.transport.weights import WeightError, pull_weights, query_weights
from cadence.wire.messages import Assignment, SharedSlot, WeightMeta, Welcome

if TYPE_CHECKING:
    from torch import Tensor

    from cadence.actors.rollout import WorkerSettings
    from cadence.transport.broadcast import BroadcastMember

log = structlog.get_logger()


def pull_address(welcome: Welcome, host: str) -> str:
    """Where a worker on `host` pulls versions from: the publisher's ipc:// address when it serves one
    on this very host, else its network address."""
    local = welcome.publisher_local
    if local.startswith("ipc://") and host and welcome.publisher_host == host:
        return local
    return welcome.publisher_address


def take_views(engine: RolloutEngine, data: mmap.mmap, views: MappingViews | None = None) -> None:
    """Load a version mapped from shared memory, which stays unchanged until the next load: the
    built-in engine computes with its tensors themselves where their dtype and device are its own
    (`TorchEngine.load_state_dict` with `share`; the tensors viewing that mapping made once, by
    `views`, where given), and copies them where not; LoRA's reads the
    adapters from the mapping (no copy of the version first: a rank-8 version's 9.8 MB, cold in the
    caches, cost its load 3-5 ms); any other engine (vLLM, the simulated one) is given the version's
    bytes as a pull would give them."""
    if isinstance(engine, TorchRolloutEngine):
        state = views.views(data) if views is not None else state_dict_from_bytes(data)
        engine.engine.load_state_dict(state, share=True)
    elif isinstance(engine, LoraRolloutEngine):
        engine.load(data)  # reads the adapters as views of the mapping: copied (step) or merged out of them
    else:
        engine.load(bytearray(data))


def shared_reader(share: bool) -> SharedReader | None:
    """A worker's reader of shared versions when it may (`share`) and its host can share (else one
    log line says why it pulls)."""
    if not share:
        return None
    problem = sharing_problem()
    if problem is not None:
        log.warning("shared_memory_fallback", reason=problem, fallback="zmq")
        return None
    return SharedReader()


def device_reader(engine: RolloutEngine, share: bool) -> DeviceReader | None:
    """A worker's reader of the versions a publisher offers on its GPU: for the built-in engine on a
    CUDA device, when it may share (else one log line says why not, where the device is CUDA)."""
    if not share or not isinstance(engine, TorchRolloutEngine) or engine.engine.device.type != "cuda":
        return None
    device = engine.engine.device
    problem = device_sharing_problem(device)
    if problem is not None:
        log.warning("device_sharing_fallback", reason=problem, fallback="shm")
        return None
    return DeviceReader(device)


def take_device_views(engine: RolloutEngine, held: HeldBuffer) -> None:
    """Load a version from a device buffer: its tensors copied into the engine's on the device, or
    taken as they are where the engine may (`load_state_dict` with `share`: not compiled)."""
    if not isinstance(engine, TorchRolloutEngine):
        raise TypeError(
            f"a version on a device is loaded by the built-in engine, not {type(engine).__name__}"
        )
    engine.engine.load_state_dict(image_views(held.data), share=True)


class WorkerWeights:
    """`engine`: where versions are loaded; `buffers`: where pulled versions are assembled, each in
    the buffer of one loaded before (the engine may compute with the bytes of the version it holds:
    the pool hands that buffer out only once nothing views it); `member`: the worker's membership of
    a broadcast weights.transport (set on each Welcome), None with "zmq"; `shared`: the reader of
    the versions a publisher on this host shares (None: built from `settings.share_weights`)."""

    def __init__(
        self,
        engine: RolloutEngine,
        settings: WorkerSettings,
        liveness: Liveness,
        clock: Callable[[], float],
        use_threads: Callable[[int], None] | None = None,
        buffers: BufferPool | None = None,
        shared: SharedReader | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.liveness = liveness
        self.clock = clock
        self.use_threads = use_threads
        # two: the loaded version's (which the engine may compute with) and the one before it (free)
        self.buffers = buffers or BufferPool(keep=2)
        self._engine_lock = threading.Lock()  # a cancelled job's thread may still be using the engine
        self.loaded: int | None = None
        self.source = ""  # how the loaded version came: shm, zmq, or the broadcast's backend
        self.playing: int | None = None  # the version a batch is made with: nothing loads meanwhile
        self.member: BroadcastMember | None = None  # with a broadcast weights.transport
        self.shared = shared if shared is not None else shared_reader(settings.share_weights)
        self._mapped: Mapped | HeldBuffer | None = None  # the slot of the loaded version, if shared
        self._views = MappingViews()  # the tensors viewing each mapping `shared` keeps
        self.device = device_reader(engine, settings.share_weights)
        self._alike: bool | None = None  # its engine computes alike with both budgets (asked once)
        self.activity: ActivityReader | None = None  # the trainer's on this host, read between steps

    async def pull(self, publisher: Client, version: int) -> bytearray:
        """The weights of `version`. When a lost trainer is waited for (`trainer.on_loss = "wait"`) and
        the publisher fails, its trainer may be coming back: wait (up to 10 liveness timeouts) for the
        Welcome naming the new one, which ends this job; otherwise, or past that wait, the failure
        ends the worker."""
        try:
            return await pull_weights(publisher, version, self.liveness.timeout_s, alloc=self.buffers.take)
        except WeightError as err:
            if self.settings.on_trainer_loss != "wait":
                raise
            log.warning("weights_unavailable_waiting", version=version, error=str(err))
            await asyncio.sleep(10 * self.liveness.timeout_s)
            raise

    def _budget(self) -> None:
        """Compute in the calling (worker) thread with the budget of the moment (`threads_now`)."""
        if self.use_threads is not None and self.settings.threads > 0:
            self.use_threads(self.threads_now(self.use_threads))

    def threads_now(self, use_threads: Callable[[int], None]) -> int:
        """`threads_alone` where the engine computes the same bits with it as with `threads` (measured
        at the first computation) and the trainer waits: always in sync mode, in periodic mode while
        the trainer's activity on this host says it computes nothing; `threads` otherwise."""
        share, alone = self.settings.threads, self.settings.threads_alone
        if alone <= share:
            return share
        if self._alike is None:
            self._alike = self._probe(use_threads, share, alone)
        if not self._alike:
            return share
        if not self.settings.trainer_beside:
            return alone
        activity = self.activity
        return share if activity is None or activity.busy() else alone

    def _probe(self, use_threads: Callable[[int], None], share: int, alone: int) -> bool:
        use_threads(share)  # the probe leaves the calling thread's count as it found it
        engine = self.engine if isinstance(self.engine, ThreadedEngine) else None
        alike = engine is not None and engine.alike_at_threads(share, alone)
        log.info("rollout_threads", share=share, alone=alone, alike=alike)
        if engine is not None and alike and self.settings.trainer_beside:
            engine.pace = self._budget  # asked again between two decode steps
        return alike

    def _watch(self, slot: SharedSlot | None) -> None:
        """Read the activity of the trainer whose publisher shares `slot` (a new one: reopened)."""
        if slot is None or not self.settings.trainer_beside:
            return
        if self.activity is not None and self.activity.names(slot):
            return
        if self.activity is not None:
            self.activity.close()
        self.activity = ActivityReader.of(slot)
        log.info("trainer_activity", trainer_pid=slot.pid, readable=self.activity is not None)

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """The engine to this thread alone, with the worker's thread budget."""
        with self._engine_lock:
            self._budget()
            yield

    @contextlib.contextmanager
    def turn(self, version: int) -> Iterator[None]:
        """`computing` for one generation (a batch's, or a turn of its episodes) of `version`, refused
        when another is loaded."""
        with self.computing():
            if self.loaded != version:
                raise RuntimeError(f"episodes of version {version} would go on with {self.loaded} loaded")
            yield

    def _load(self, data: bytearray) -> None:
        with self.computing():
            self.engine.load(data)
        self._hold(None)

    def _load_state(self, state: Mapping[str, Tensor]) -> None:
        with self.computing():
            self.engine.load_state(state)
        self._hold(None)

    def _map_and_load(self, reader: SharedReader, meta: WeightMeta) -> int:
        """Map `meta.version` (`SharedReader.map`'s errors) and load it, in one thread: its size."""
        mapped = reader.map(meta)
        self._views.keep_only(reader.keeps)
        try:
            with self.computing():
                take_views(self.engine, mapped.data, self._views)
        except BaseException:
            mapped.release()
            raise
        self._hold(mapped)
        return len(mapped.data)

    def _load_device(self, held: HeldBuffer) -> None:
        try:
            with self.computing():
                take_device_views(self.engine, held)
        except BaseException:
            held.release()
            raise
        self._hold(held)

    def _hold(self, mapped: Mapped | HeldBuffer | None) -> None:
        """Hold the slot of the version just loaded (if mapped), and let the one before go."""
        before, self._mapped = self._mapped, mapped
        if before is not None:
            before.release()

    def _no_sharing(self, reason: str) -> None:
        log.warning("shared_memory_fallback", reason=reason, fallback="zmq")
        self.shared = None

    async def _meta(self, publisher: Client, version: int, device: bool) -> WeightMeta | None:
        """Where the publisher offers `version` beside its pulls, when this worker may take it from
        memory on its host (None: it is pulled); with `device`, perhaps on its GPU alone, before the
        version's host bytes are in (`available` False)."""
        if self.shared is None and self.device is None:
            return None
        try:
            meta = await query_weights(publisher, version, self.liveness.timeout_s, device)
        except WeightError:
            return None  # the pull meets the same silence, and deals with it
        return meta if meta.available or (device and meta.device is not None) else None

    async def _open_device(self, meta: WeightMeta) -> HeldBuffer | None:
        """`meta.version` in the buffer its publisher offers on this worker's GPU, verified; None when
        it is not to be had there (then it is mapped from host memory, or pulled)."""
        reader = self.device
        if reader is None or meta.device is None:
            return None
        try:
            held = await asyncio.to_thread(reader.open, meta)
            self._watch(meta.shared)
            return held
        except SharingImpossible as err:
            self._no_device(str(err))
        except SharedError as err:
            log.warning("device_version_refused", version=meta.version, reason=str(err), fallback="shm")
        except Exception as err:  # the device's own failure: its versions come through host memory
            self._no_device(repr(err))
        return None

    def _no_device(self, reason: str) -> None:
        log.warning("device_sharing_fallback", reason=reason, fallback="shm")
        self.device = None

    async def _map(self, meta: WeightMeta) -> int | None:
        """`meta.version` mapped from the publisher's shared memory, verified, and loaded: its size;
        None when it is not to be had there (then it is pulled)."""
        reader = self.shared
        if reader is None:
            return None
        if meta.shared is None:
            self._no_sharing("the publisher does not share its versions")
            return None
        try:
            nbytes = await asyncio.to_thread(self._map_and_load, reader, meta)
            self._watch(meta.shared)
            return nbytes
        except SharingImpossible as err:
            self._no_sharing(str(err))
        except SharedError as err:
            log.warning("shared_version_refused", version=meta.version, reason=str(err), fallback="zmq")
        return None

    async def fetch_and_load(self, publisher: Client, version: int) -> tuple[str, int]:
        """Load `version`: broadcast tensors when this worker is in that broadcast, else pulled bytes.
        Where they came from and their size."""
        if self.playing is not None:
            raise RuntimeError(f"version {version} asked while the episodes of {self.playing} run")
        if self.member is not None:
            wait = 3 * self.settings.broadcast_timeout_s + self.liveness.timeout_s
            state = await self.member.weights(version, wait)
            if state is not None:
                await asyncio.to_thread(self._load_state, state)
                return self.settings.weights_transport, state_nbytes(state)
        meta = await self._meta(publisher, version, self.device is not None)
        held = None if meta is None else await self._open_device(meta)
        if held is not None:
            try:
                await asyncio.to_thread(self._load_device, held)
                return "cuda-ipc", held.data.numel()
            except Exception as err:  # loaded from host memory instead, as every version from now on
                self._no_device(repr(err))
        if meta is not None and not meta.available:  # on the GPU alone so far: asked again, answered
            meta = await self._meta(publisher, version, False)  # once its host bytes are in
        mapped = None if meta is None else await self._map(meta)
        if mapped is not None:
            return "shm", mapped
        data = await self.pull(publisher, version)
        await asyncio.to_thread(self._load, data)
        self.buffers.give(data)  # a later version's pages once the engine no longer computes with them
        return "zmq", len(data)

    async def ensure(self, job: Assignment, publisher: Client) -> float:
        """Load the version `job` names unless it is loaded; the seconds it took."""
        version = job.version
        if version == self.loaded:
            return 0.0
        with span(self.clock, "load", period=job.period, version=version) as loading:
            source, nbytes = await self.fetch_and_load(publisher, version)
            self.loaded, self.source = version, source
        load_s = loading.duration
        log.info("weights_loaded", version=version, source=source, nbytes=nbytes, load_s=round(load_s, 4))
        return load_s
