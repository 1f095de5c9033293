"""What a node of a Slurm run's control job does (`cadence slurm task --role control DIR`); the
rollout job's task is `rollout.py`.

Invariant: a task leaves no process of its own behind: on SIGTERM (scancel, the time limit, a
requeue) it stops its children before it exits. A control job never starts a run over in a folder
that holds its periods (`should_resume`), and a stop ends the run at its last checkpoint's version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from cadence.config import load_config
from cadence.launch.launcher import LaunchError, prepare_resume
from cadence.launch.slurm.allocation import Allocation, SlurmError
from cadence.launch.slurm.children import Signals, cadence_command, deaf_to_usr1, stop_children, wait_for
from cadence.launch.slurm.interfaces import choose_address
from cadence.launch.slurm.jobs import run_command
from cadence.launch.torchrun import free_port
from cadence.monitor.run_dir import read_new_lines, write_whole
from cadence.training.resume import (
    ResumeError,
    ask_for_checkpoint,
    checkpoint_asked,
    clear_checkpoint_ask,
    find_resume,
)

log = structlog.get_logger()

STOP_FILE = "stop"
"""`DIR/slurm/stop`: `cadence slurm stop` asks the control task to end the run."""

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")


def network_env(env: Mapping[str, str], ifname: str) -> dict[str, str]:
    """`env` with the collectives' interface variables set to `ifname` where the user set none."""
    return {**env, **{name: ifname for name in IFNAME_VARIABLES if not env.get(name)}}


def should_resume(out: Path, alloc: Allocation) -> bool:
    """Whether a control job continues from the run's resume checkpoint: when the run in `out` has
    periods recorded or the job was requeued, and a checkpoint is there. Periods recorded and no
    checkpoint is a `SlurmError`: a run is never started over in a folder that holds its periods (they
    would be counted twice)."""
    metrics = out / "metrics.jsonl"
    started = metrics.exists() and metrics.stat().st_size > 0
    try:
        has_checkpoint = find_resume(out / "checkpoints") is not None
    except ResumeError:
        has_checkpoint = True  # damaged: `prepare_resume` names the file
    if started and not has_checkpoint:
        raise SlurmError(
            f"the run in {out} has periods in metrics.jsonl and no resume checkpoint to go on from"
            f" (trainer.checkpoint_every = 0?): control job {alloc.job_id} (restart {alloc.restarts})"
            " will not start it over and count its periods twice; continue it with a new --out"
        )
    return has_checkpoint and (alloc.restarts > 0 or started)


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
        self.requeued = False  # this task asked Slurm to requeue its job
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
            stop_children(self.procs)

    def _start(self, args: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, env=self.env, preexec_fn=deaf_to_usr1)
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
            return cadence_command(*args)
        nodes = len(self.alloc.nodes)
        host = "true" if self.alloc.first else "false"
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc-per-node", str(self.cfg.trainer.ranks // nodes),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", f"cadence-{self.alloc.job_id}",
            "--rdzv-conf", f"is_host={host}", "--local-addr", self.address, "-m", "cadence", *args,
        ]  # fmt: skip

    def _lead(self) -> int:
        try:
            resume = should_resume(self.out, self.alloc)
        except SlurmError as err:
            log.error(
                "control_cannot_resume", job=self.alloc.job_id, restarts=self.alloc.restarts, reason=str(err)
            )
            raise
        config = self.out / "config.json"
        if not resume and self.alloc.restarts:
            log.warning("control_starts_over", restarts=self.alloc.restarts, reason="no period recorded yet")
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
            cadence_command("dispatcher", "--config", str(config), "--out", str(self.out), "--bind",
                     f"tcp://{self.address}:*", "--set", f"transport.host='{self.address}'", *again)
        )  # fmt: skip
        addr = self.out / "dispatcher.addr"
        wait_for(lambda: addr.exists() and bool(addr.read_text().strip()) or dispatcher.poll() is not None,
                  120, self.signals, "dispatcher address")  # fmt: skip
        if dispatcher.poll() is not None:
            return dispatcher.returncode or 1
        plan = {"dispatcher": addr.read_text().strip(), "resume": resume, "endpoint": ""}
        if self.cfg.trainer.ranks > 1:  # what the job's other nodes start their ranks with
            plan["endpoint"] = f"{self.address}:{free_port(self.address)}"
            write_whole(self.rendezvous, json.dumps(plan) + "\n")
        trainer = self._start(self._trainer_command(str(plan["dispatcher"]), resume, str(plan["endpoint"])))
        return self._watch(dispatcher, trainer)

    def _follow(self) -> int:
        if self.cfg.trainer.ranks <= 1:
            log.info("control_node_idle", reason="trainer.ranks = 1: the trainer runs on node 0 alone")
            while not self.signals.term and not (self.out / "summary.json").exists():
                time.sleep(1.0)
            return 0
        wait_for(self.rendezvous.exists, 300, self.signals, "the first node's rendezvous address")
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
                self.requeued = True
                run_command(["scontrol", "requeue", self.alloc.job_id])
            if stop.exists() and not stopping:
                stopping = True
                self._checkpoint(dispatcher, then_stop=True)  # the trainer's last period
                self._until_recorded(dispatcher)
                dispatcher.send_signal(signal.SIGUSR2)  # the run ends now, its summary written
            time.sleep(0.2)
        if dispatcher.returncode == -signal.SIGTERM and self._job_ends():
            log.info("dispatcher_stopped", job=self.alloc.job_id, requeued=self.requeued,
                     reason="Slurm ended the job's processes (requeue, cancel or time limit)")  # fmt: skip
            return 143
        try:
            trainer.wait(60)
        except subprocess.TimeoutExpired:
            log.warning("trainer_outlived_dispatcher")
        if dispatcher.returncode < 0:
            log.error("dispatcher_killed", signal=-dispatcher.returncode)
            return 1
        return dispatcher.returncode

    def _job_ends(self, grace_s: float = 5.0) -> bool:
        """Whether Slurm is ending this job: Slurm sends SIGTERM to every process of the job at once,
        so a dispatcher ended by it is soon followed by this task's own signal (or the task requeued
        the job itself)."""
        deadline = time.monotonic() + grace_s
        while not (self.requeued or self.signals.term) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.requeued or self.signals.term

    def _until_recorded(self, dispatcher: subprocess.Popen[bytes]) -> None:
        """Wait until the dispatcher has the row of the checkpoint's last period (on its way from the
        trainer), so the summary counts exactly the periods the checkpoint holds."""
        try:
            wait_for(lambda: recorded_through(self.out) or dispatcher.poll() is not None, 60, self.signals,
                     "metrics row of the checkpoint's last period")  # fmt: skip
        except SlurmError as err:
            log.warning("checkpoint_row_missing", error=str(err))

    def _checkpoint(self, dispatcher: subprocess.Popen[bytes], then_stop: bool = False) -> None:
        """Ask the trainer for a resume checkpoint after its current period (`then_stop`: and no period
        after it) and wait until written."""
        root = self.out / "checkpoints"
        try:
            ask_for_checkpoint(root, then_stop)
        except OSError as err:  # a full disk: the run ends at the checkpoint it has
            log.warning("checkpoint_not_asked", error=str(err))
            return
        try:
            wait_for(
                lambda: not checkpoint_asked(root) or dispatcher.poll() is not None,
                600,
                self.signals,
                "checkpoint",
            )
        except SlurmError as err:
            log.warning("checkpoint_not_written", error=str(err))


def recorded_through(out: Path) -> bool:
    """The dispatcher has recorded every period the run's resume checkpoint holds (its metrics row
    of the period before the checkpoint's version is in `metrics.jsonl`)."""
    try:
        found = find_resume(out / "checkpoints")
    except ResumeError:
        return True
    rows, _ = read_new_lines(out / "metrics.jsonl", 0)
    return found is None or any(r.get("period") == found[1]["version"] - 1 for r in rows)


def control_task(out: Path, alloc: Allocation, ifname: str, env: Mapping[str, str] = os.environ) -> int:
    return ControlTask(out, alloc, ifname, env).run()
