"""What a node of a Slurm run does (`cadence slurm task --role control|rollout DIR`).

Invariant: a task leaves no process of its own behind: on SIGTERM (scancel, the time limit, a
requeue) it stops its children before it exits; a rollout task ends when the run has (its summary
is written) and starts its worker again while it has not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import structlog

from cadence.config import load_config
from cadence.launch.launcher import LaunchError, prepare_resume
from cadence.launch.slurm.allocation import Allocation, SlurmError
from cadence.launch.slurm.interfaces import choose_address
from cadence.launch.slurm.jobs import read_jobs, run_command, squeue_jobs
from cadence.launch.torchrun import free_port
from cadence.training.resume import ask_for_checkpoint, checkpoint_asked, clear_checkpoint_ask

log = structlog.get_logger()

STOP_FILE = "stop"
"""`DIR/slurm/stop`: `cadence slurm stop` asks the control task to end the run."""

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")


@dataclass
class Signals:
    """The signals a task was sent, as flags its loop reads (no work in a signal handler)."""

    usr1: bool = False
    term: bool = False

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._take)

    def _take(self, signum: int, _: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            self.usr1 = True
        else:
            self.term = True


def worker_name(alloc: Allocation) -> str:
    """A rollout job's worker name: the same after a requeue (the job keeps its id)."""
    return f"rollout-{alloc.job_id}" + (f"-{alloc.node_index}" if len(alloc.nodes) > 1 else "")


def network_env(env: Mapping[str, str], ifname: str) -> dict[str, str]:
    """`env` with the collectives' interface variables set to `ifname` where the user set none."""
    return {**env, **{name: ifname for name in IFNAME_VARIABLES if not env.get(name)}}


def should_resume(out: Path, alloc: Allocation) -> bool:
    """A control job continues from the run's resume checkpoint when it was requeued, or when the run
    in `out` has periods recorded already."""
    has_checkpoint = (out / "checkpoints" / "resume").exists()
    started = (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size > 0
    return has_checkpoint and (alloc.restarts > 0 or started)


def _deaf_to_usr1() -> None:
    """In a child, before it runs: Slurm signals every process of the step (the time-limit notice),
    and SIGUSR1 would end one that does not handle it; this task alone acts on it."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _cadence(*args: str) -> list[str]:
    return [sys.executable, "-m", "cadence", *args]


def _stop_children(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(ready: Callable[[], bool], timeout_s: float, signals: Signals, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if signals.term:
            raise SlurmError(f"stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise SlurmError(f"no {what} after {timeout_s:.0f}s")
        time.sleep(0.2)


class ControlTask:
    """The control job's task on one node: node 0 runs the dispatcher and the trainer's rank 0 (its
    publisher in the same process); every other node runs its share of the trainer's ranks."""

    def __init__(self, out: Path, alloc: Allocation, ifname: str, env: Mapping[str, str]) -> None:
        self.out = out
        self.alloc = alloc
        self.cfg = load_config(out / "config.json", [])
        toward = [n for i, n in enumerate(alloc.nodes) if i != alloc.node_index] + [alloc.submit_host]
        self.ifname, self.address = choose_address(ifname, toward)
        self.env = network_env({**env, "PYTHONUNBUFFERED": "1"}, self.ifname)
        self.signals = Signals()
        self.procs: list[subprocess.Popen[bytes]] = []
        tag = f"{alloc.job_id}-{alloc.restarts}"
        self.rendezvous = out / "slurm" / f"rendezvous-{tag}"

    def run(self) -> int:
        self.signals.install()
        log.info(
            "control_task",
            node=self.alloc.nodes[self.alloc.node_index],
            ifname=self.ifname,
            address=self.address,
        )
        try:
            if not self.alloc.first:
                return self._follow()
            return self._lead()
        finally:
            _stop_children(self.procs)

    def _start(self, args: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, env=self.env, preexec_fn=_deaf_to_usr1)
        self.procs.append(proc)
        return proc

    def _trainer_command(self, connect: str, resume: bool, endpoint: str = "") -> list[str]:
        """The trainer on this node: alone, or this node's share of its ranks under torchrun (c10d
        rendezvous at `endpoint`, hosted by node 0; each node tells the others its chosen address,
        not a host name that may not resolve). Whichever rank is 0 binds this node's address."""
        args = [
            "trainer",
            "--connect",
            connect,
            "--config",
            str(self.out / "config.json"),
            "--out",
            str(self.out),
        ]
        args += ["--set", f"transport.host='{self.address}'", "--set", "transport.advertise_host=''"]
        args += ["--resume"] if resume else []
        if self.cfg.trainer.ranks <= 1:
            return _cadence(*args)
        nodes = len(self.alloc.nodes)
        host = "true" if self.alloc.first else "false"
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc-per-node", str(self.cfg.trainer.ranks // nodes),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", f"cadence-{self.alloc.job_id}",
            "--rdzv-conf", f"is_host={host}", "--local-addr", self.address, "-m", "cadence", *args,
        ]  # fmt: skip

    def _lead(self) -> int:
        resume = should_resume(self.out, self.alloc)
        config = self.out / "config.json"
        if resume:
            try:
                _, version = prepare_resume(self.cfg, self.out)
            except LaunchError as err:
                raise SlurmError(str(err)) from None
            log.info("control_resumes", version=version, restarts=self.alloc.restarts)
        else:
            (self.out / "dispatcher.addr").unlink(missing_ok=True)
        (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
        clear_checkpoint_ask(self.out / "checkpoints")  # an earlier job's, never answered
        again = ["--resume"] if resume else []
        dispatcher = self._start(
            _cadence("dispatcher", "--config", str(config), "--out", str(self.out), "--bind",
                     f"tcp://{self.address}:*", "--set", f"transport.host='{self.address}'", *again)
        )  # fmt: skip
        addr = self.out / "dispatcher.addr"
        _wait_for(lambda: addr.exists() and bool(addr.read_text().strip()) or dispatcher.poll() is not None,
                  120, self.signals, "dispatcher address")  # fmt: skip
        if dispatcher.poll() is not None:
            return dispatcher.returncode or 1
        plan = {"dispatcher": addr.read_text().strip(), "resume": resume, "endpoint": ""}
        if self.cfg.trainer.ranks > 1:  # what the job's other nodes start their ranks with
            plan["endpoint"] = f"{self.address}:{free_port(self.address)}"
            tmp = self.rendezvous.with_suffix(".tmp")
            tmp.write_text(json.dumps(plan) + "\n")
            tmp.replace(self.rendezvous)
        trainer = self._start(self._trainer_command(str(plan["dispatcher"]), resume, str(plan["endpoint"])))
        return self._watch(dispatcher, trainer)

    def _follow(self) -> int:
        if self.cfg.trainer.ranks <= 1:
            log.info("control_node_idle", reason="trainer.ranks = 1: the trainer runs on node 0 alone")
            while not self.signals.term and not (self.out / "summary.json").exists():
                time.sleep(1.0)
            return 0
        _wait_for(self.rendezvous.exists, 300, self.signals, "the first node's rendezvous address")
        plan = json.loads(self.rendezvous.read_text())
        trainer = self._start(
            self._trainer_command(plan["dispatcher"], bool(plan["resume"]), plan["endpoint"])
        )
        while trainer.poll() is None and not self.signals.term:
            time.sleep(0.2)
        return 0 if self.signals.term else trainer.wait()

    def _watch(self, dispatcher: subprocess.Popen[bytes], trainer: subprocess.Popen[bytes]) -> int:
        stop = self.out / "slurm" / STOP_FILE
        stopping = False
        while dispatcher.poll() is None:
            if self.signals.term:
                return 143
            if self.signals.usr1:  # the time limit is near: a checkpoint, then the job requeued
                self.signals.usr1 = False
                self._checkpoint(dispatcher)
                log.info("control_requeue", job=self.alloc.job_id)
                run_command(["scontrol", "requeue", self.alloc.job_id])
            if stop.exists() and not stopping:
                stopping = True
                self._checkpoint(dispatcher)
                dispatcher.send_signal(signal.SIGUSR2)  # the run ends now, its summary written
            time.sleep(0.2)
        try:
            trainer.wait(60)
        except subprocess.TimeoutExpired:
            log.warning("trainer_outlived_dispatcher")
        if dispatcher.returncode < 0:
            log.error("dispatcher_killed", signal=-dispatcher.returncode)
            return 1
        return dispatcher.returncode

    def _checkpoint(self, dispatcher: subprocess.Popen[bytes]) -> None:
        """Ask the trainer for a resume checkpoint after its current period and wait until written."""
        root = self.out / "checkpoints"
        ask_for_checkpoint(root)
        try:
            _wait_for(
                lambda: not checkpoint_asked(root) or dispatcher.poll() is not None,
                600,
                self.signals,
                "checkpoint",
            )
        except SlurmError as err:
            log.warning("checkpoint_not_written", error=str(err))


class ControlWatch:
    """Whether the run's control job is still in Slurm's queue (running, pending, or requeued),
    asked of squeue at most every `every_s` seconds; True where that cannot be told."""

    def __init__(self, out: Path, every_s: float = 5.0) -> None:
        self.out = out
        self.every_s = every_s
        self.asked = 0.0
        self.alive = True

    def __call__(self) -> bool:
        if time.monotonic() - self.asked < self.every_s:
            return self.alive
        self.asked = time.monotonic()
        try:
            control = [j["id"] for j in read_jobs(self.out) if j["role"] == "control"]
            self.alive = bool(squeue_jobs(control)) if control else True
        except (SlurmError, OSError, subprocess.TimeoutExpired):
            self.alive = True
        return self.alive


def rollout_task(out: Path, alloc: Allocation, env: Mapping[str, str]) -> int:
    """One worker that joins the run, and joins the dispatcher again whenever the control job comes
    back (requeued), until the run has ended."""
    signals = Signals()
    signals.install()
    name = worker_name(alloc)
    control_alive = ControlWatch(out)
    addr, summary = out / "dispatcher.addr", out / "summary.json"
    child: list[subprocess.Popen[bytes]] = []
    try:
        while not summary.exists() and not signals.term:
            if not (addr.exists() and addr.read_text().strip()):
                time.sleep(0.5)
                continue
            seen = addr.stat().st_mtime_ns
            address = addr.read_text().strip()
            log.info("rollout_task_joins", worker=name, dispatcher=address)
            args = ["rollout", "--connect", address, "--name", name, "--config", str(out / "config.json")]
            command = _cadence(*args, "--out", str(out))
            child[:] = [
                subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, preexec_fn=_deaf_to_usr1)
            ]
            while child[0].poll() is None and not signals.term:
                time.sleep(0.2)
            if signals.term:
                break
            if child[0].returncode == 0 or summary.exists():
                return 0
            # the dispatcher went away (its job requeued) or refused us: wait for it to come back
            while (
                addr.exists()
                and addr.stat().st_mtime_ns == seen
                and not summary.exists()
                and not signals.term
            ):
                if not control_alive():
                    log.error("control_job_gone", worker=name, reason="the run ended without its summary")
                    return 1
                time.sleep(0.5)
        return 0 if summary.exists() else 143
    finally:
        _stop_children(child)


def control_task(out: Path, alloc: Allocation, ifname: str, env: Mapping[str, str] = os.environ) -> int:
    return ControlTask(out, alloc, ifname, env).run()
