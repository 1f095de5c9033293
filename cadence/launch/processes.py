"""One actor process each: build its channels and dependencies from the config, run it, clean up.

Invariant: every socket and context a process opens is closed when its actor returns or fails,
and the process exit status says which (0 done, 1 failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import structlog
import uvloop

from cadence.config import ConfigError, RunConfig
from cadence.launch.secret import make_run_secret, read_run_secret
from cadence.launch.sharing import device_versions, shared_versions
from cadence.monitor.run_dir import write_whole
from cadence.training.ranks import Ranks
from cadence.transport.buffers import BufferPool
from cadence.transport.zmq_socket import ZmqNetwork, listen_address
from cadence.wire.buffer import Buffer

if TYPE_CHECKING:
    from cadence.actors.publisher import Publisher
    from cadence.actors.trainer import Publish, PublishEarly
    from cadence.log import LogStream
    from cadence.training.learner import Learner
    from cadence.transport.broadcast import BroadcastRoot
    from cadence.transport.endpoint import Server

log = structlog.get_logger()


def exit_status(main: Callable[[], object]) -> int:
    """Call `main`; 0 when it returns, 1 when it fails (logged), 130 when interrupted."""
    try:
        main()
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 130
    except Exception as exc:
        log.error("actor_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
        return 1
    return 0


def end_rank(status: int) -> NoReturn:
    """End a process of a trainer of several ranks with `status`, its output flushed, without the
    interpreter's teardown: gloo's C++ threads can abort a process torn down after its process group
    was destroyed ("terminate called without an active exception", SIGABRT), which would turn a
    finished run into a failed one. Nothing is left that needs it: the group is destroyed, the logs
    are line-buffered files, and the actor has returned."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def run_async(main: Callable[[], Awaitable[None]]) -> int:
    """Run `main` on a uvloop event loop; its `exit_status`."""
    return exit_status(lambda: uvloop.run(main()))  # type: ignore[arg-type]


def _bind_address(cfg: RunConfig, port: int) -> str:
    t = cfg.transport
    return listen_address(t.listen, t.host, port, t.advertise_host)


def _network(cfg: RunConfig) -> ZmqNetwork:
    keys = Path(cfg.transport.keys) if cfg.transport.keys else None
    t = cfg.transport
    return ZmqNetwork(cfg.run_id, t.max_frame_bytes, keys, t.receive_queue, t.refused_bytes_per_s)


def advertised(bound: str, cfg: RunConfig) -> str:
    """The address to tell others: the bound one, its host replaced by `transport.advertise_host`
    (or by this machine's name when bound to every interface)."""
    host = cfg.transport.advertise_host or (
        socket.gethostname() if bound.startswith("tcp://0.0.0.0:") else ""
    )
    if not host or not bound.startswith("tcp://"):
        return bound
    return f"tcp://{host}:{bound.rsplit(':', 1)[1]}"


async def dispatcher_main(
    cfg: RunConfig, bind: str, out: Path, stream: LogStream | None = None, resume: bool = False
) -> None:
    """The dispatcher; with `resume` the periods already in `metrics.jsonl` count in the summary."""
    from cadence.actors.dispatcher import Dispatcher
    from cadence.launch.alive import keep_alive
    from cadence.launch.settings import dispatcher_settings, liveness, log_bounds
    from cadence.monitor.logstream import LogHub
    from cadence.monitor.run_dir import RunRecorder
    from cadence.monitor.writers import make_writers
    from cadence.tasks.heldout import eval_prompts, held_out
    from cadence.tasks.registry import make_task
    from cadence.transport.session import first_of

    secret = make_run_secret(out)  # before dispatcher.addr: a trainer that finds one finds the other
    net = _network(cfg)
    server = net.bind("dispatcher", bind)
    lease = cfg.transport.liveness_timeout_s
    hub = LogHub(server, out / "logs", time.time, lease, own=stream, bounds=log_bounds(cfg))
    recorder: RunRecorder | None = None
    try:
        write_whole(out / "dispatcher.addr", server.address + "\n")
        recorder = RunRecorder(out, cfg.mode, make_writers(cfg, out), resume=resume)
        task = make_task(cfg.task, cfg.seed, held_out(cfg.task, cfg.eval))  # training never draws those
        evals = eval_prompts(cfg.task, cfg.eval, task) if cfg.eval.every > 0 else []
        settings = dataclasses.replace(dispatcher_settings(cfg), run_secret=secret)
        beat = liveness(cfg, time.time)
        dispatcher = Dispatcher(settings, server, task, recorder, beat, time.time, hub, evals)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dispatcher.stop)  # cadence slurm stop
        await first_of(dispatcher.run(), keep_alive(out))  # DIR/dispatcher.alive while it runs
    finally:
        if recorder is not None:
            recorder.close()
        hub.close()
        net.close()


async def trainer_main(
    cfg: RunConfig,
    connect: str,
    out: Path,
    publisher_address: str | None,
    stream: LogStream | None = None,
    resume: bool = False,
    ranks: Ranks | None = None,
) -> None:
    """The trainer; with `publisher_address` None it hosts the weight publisher in this process; with
    `resume` it continues from `out/checkpoints/resume`; with several `ranks` it is rank 0 of them."""
    from cadence.actors.trainer import Trainer
    from cadence.launch.build import make_learner, make_tokenizer, vocab_limit
    from cadence.launch.settings import session, trainer_settings
    from cadence.launch.threads import use_threads
    from cadence.monitor.samples import SampleWriter
    from cadence.training.resume import RunRecord
    from cadence.transport.session import first_of

    net = _network(cfg)
    learner = None
    try:
        tokenizer = make_tokenizer(cfg)
        learner = await asyncio.to_thread(make_learner, cfg, tokenizer, ranks)
        server = net.bind("trainer", _bind_address(cfg, cfg.transport.trainer_port))
        server.address = advertised(server.address, cfg)
        secret = read_run_secret(out)
        link = net.connect("trainer", connect)
        own = session(cfg, link, "trainer", time.time, server.address, secret=secret, stream=stream)
        publish, alloc, jobs, computing, held, early = _publish_function(
            cfg, net, connect, publisher_address, learner, own.key, secret
        )
        trainer = Trainer(
            trainer_settings(cfg, vocab_limit(cfg, tokenizer)),
            server,
            own,
            learner,
            publish,
            time.time,
            out / "checkpoints",
            RunRecord.of(cfg),
            samples=SampleWriter(out / "samples"),
            resume=resume,
            use_threads=use_threads,
            alloc=alloc,
            computing=computing,
            held=held,
            early=early,
        )
        await first_of(trainer.run(), *jobs)
    finally:
        net.close()
        close = getattr(learner, "close", None)  # a data-parallel learner stops its followers
        if close is not None:
            await asyncio.to_thread(close)


class Publishing(NamedTuple):
    """What `_publish_function` gives the trainer."""

    publish: Publish
    alloc: Callable[[int], Buffer]
    jobs: list[Coroutine[Any, Any, None]]
    computing: Callable[[bool], None] | None
    held: Callable[[int], bool] | None
    early: PublishEarly | None = (
        None  # a version on the trainer's GPU first (announced before its host bytes)
    )


def _publish_function(
    cfg: RunConfig,
    net: ZmqNetwork,
    connect: str,
    publisher_address: str | None,
    learner: Learner,
    key: str,
    secret: str = "",
) -> Publishing:
    """How the trainer publishes a version, and where it serialises one: to a publisher it hosts
    (whose loop is returned to run beside it), broadcasting the learner's tensors when it has a
    broadcaster, serialised into the publisher's `buffer` (shared memory, else a pool's); or
    uploaded in chunks to the publisher at `publisher_address`, with tickets made with the
    trainer's `key`, from a pool's buffer. A pool's buffer goes back once the hosted publisher lets
    its version go, or once uploaded. Then where the trainer says whether it computes (a hosted
    publisher's `computing`, read by the workers on its host), and asks whether a worker on its
    host still holds a version (a hosted publisher's `held`)."""
    from cadence.launch.settings import publish_dtype
    from cadence.transport.weights import upload_weights

    buffers = BufferPool(keep=2)  # a version's bytes, serialised into pages touched before
    if publisher_address is None:
        publisher = _publisher(cfg, net, connect, buffers=buffers, secret=secret)
        publisher.device, publisher.device_dtype = device_versions(cfg), publish_dtype(cfg)
        if publisher.broadcaster is None and publisher.device is None:
            return Publishing(
                publisher.publish, publisher.buffer, [publisher.run()], publisher.computing, publisher.held
            )

        async def with_tensors(version: int, data: bytes | Buffer) -> str:
            return await publisher.publish(version, data, learner.tensors())

        async def on_device(version: int) -> int | None:
            return await publisher.publish_on_device(version, learner.tensors())

        early = on_device if publisher.device is not None else None
        return Publishing(
            with_tensors, publisher.buffer, [publisher.run()], publisher.computing, publisher.held, early
        )
    if cfg.weights.transport != "zmq":
        raise ConfigError(
            f"weights.transport = {cfg.weights.transport!r} broadcasts from the trainer's process:"
            " run the trainer without --publisher"
        )
    uploads = net.connect("trainer", publisher_address)
    timeout = cfg.transport.liveness_timeout_s

    async def upload(version: int, data: bytes | Buffer) -> str:
        uploaded = await upload_weights(uploads, version, data, cfg.weights.chunk_bytes, timeout, key)
        buffers.give(data)
        return uploaded

    return Publishing(upload, buffers.take, [], None, None)


def follower_main(cfg: RunConfig, ranks: Ranks) -> int:
    """A data-parallel rank other than 0: trains rank 0's micro-batches until told to stop; 0 when
    stopped, 1 when a collective failed (rank 0 ended or hung)."""
    from cadence.launch.build import join_ranks, make_tokenizer
    from cadence.training.parallel import follow

    def follow_until_stopped() -> None:
        comm, local = join_ranks(cfg, make_tokenizer(cfg), ranks)
        try:
            follow(local, comm)
        finally:
            comm.close()

    return exit_status(follow_until_stopped)


async def publisher_main(cfg: RunConfig, connect: str, out: Path, stream: LogStream | None = None) -> None:
    net = _network(cfg)
    try:
        if cfg.weights.transport != "zmq":
            raise ConfigError(
                f"weights.transport = {cfg.weights.transport!r} broadcasts from the trainer's process:"
                " a separate publisher cannot, run the trainer without --publisher"
            )
        secret = read_run_secret(out)
        publisher = _publisher(cfg, net, connect, with_broadcast=False, secret=secret, stream=stream)
        write_whole(out / "publisher.addr", publisher.server.address + "\n")
        await publisher.run()
    finally:
        net.close()


def _publisher(
    cfg: RunConfig,
    net: ZmqNetwork,
    connect: str,
    with_broadcast: bool = True,
    buffers: BufferPool | None = None,
    secret: str = "",
    stream: LogStream | None = None,
) -> Publisher:
    from cadence.actors.publisher import Publisher
    from cadence.launch.settings import publisher_settings, session
    from cadence.transport.weights import WeightStore

    server = net.bind("publisher", _bind_address(cfg, cfg.transport.publisher_port))
    server.address = advertised(server.address, cfg)
    local = server.bind_local()  # workers on this host pull versions through a Unix socket
    return Publisher(
        server,
        session(
            cfg,
            net.connect("publisher", connect),
            "publisher",
            time.time,
            server.address,
            local,
            secret,
            stream,
        ),
        WeightStore(cfg.weights.chunk_bytes, cfg.weights.keep_versions, buffers.give if buffers else None),
        _broadcaster(cfg, server) if with_broadcast else None,
        publisher_settings(cfg),
        shared=shared_versions(cfg),
        alloc=buffers.take if buffers is not None else bytearray,
    )


def _broadcaster(cfg: RunConfig, server: Server) -> BroadcastRoot | None:
    """The root of the weight broadcasts when `weights.transport` asks for one."""
    w = cfg.weights
    if w.transport == "zmq":
        return None
    from cadence.transport.broadcast import BroadcastRoot

    host = server.address.removeprefix("tcp://").rsplit(":", 1)[0]  # advertised() already chose it
    if server.address.startswith("ipc://"):
        host = cfg.transport.host
    return BroadcastRoot(
        server,
        w.transport,
        cfg.transport.host,
        host,
        w.broadcast_port,
        w.bucket_bytes,
        w.broadcast_timeout_s,
        cfg.run_id or "cadence",
    )


async def rollout_main(cfg: RunConfig, connect: str, name: str, stream: LogStream | None = None) -> None:
    from cadence.actors.rollout import RolloutWorker
    from cadence.launch.build import make_engine, make_episodes, make_group_maker, make_tokenizer
    from cadence.launch.settings import session, worker_settings
    from cadence.launch.threads import use_threads
    from cadence.tasks.registry import make_task
    from cadence.transport.malloc import keep_freed_memory

    keep_freed_memory()  # every version arrives as large frames: reuse their pages
    net = _network(cfg)
    try:
        task = make_task(cfg.task, cfg.seed)
        tokenizer = make_tokenizer(cfg, task)
        episodes = make_episodes(cfg, tokenizer)  # a name that does not load stops the worker here
        engine = await asyncio.to_thread(make_engine, cfg, tokenizer)
        worker = RolloutWorker(
            worker_settings(cfg),
            name,
            session(cfg, net.connect(name, connect), "rollout", time.time, stream=stream),
            net.connect,
            make_group_maker(cfg, tokenizer, engine, episodes, task),
            time.time,
            use_threads=use_threads,
        )
        await worker.run()
    finally:
        net.close()


def default_name(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}"
