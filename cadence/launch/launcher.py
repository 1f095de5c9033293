"""`cadence run`: every actor of a run as its own OS process on this machine, watched to the end.

```
 config.json ─► dispatcher (binds, writes dispatcher.addr) ─► trainer + publisher ─► N rollout workers
 (trainer.ranks > 1: torchrun starts the trainer's ranks; rank 0 is the actor, see cadence/launch/torchrun.py)
 (--resume DIR: metrics.jsonl cut back to the checkpoint's period; dispatcher and trainer get --resume)
 every 0.2 s: new metrics.jsonl lines ─► progress; a process that failed ─► stop all, exit 1
 dispatcher done ─► summary.json ─► the rest stop on its Shutdown (or are terminated)
```

Invariant: when `launch` returns or raises (Ctrl-C included), no process it started is left running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cadence.config import ConfigError, RunConfig, TransportConfig, load_config, to_dict
from cadence.launch.secret import make_run_secret
from cadence.launch.threads import openmp_waits
from cadence.launch.torchrun import die_with_parent, free_port, torchrun
from cadence.monitor.progress import Progress
from cadence.monitor.run_dir import truncate_metrics, write_json
from cadence.training.resume import ResumeError, RunRecord, check_config, check_files, find_resume
from cadence.transport.keys import make_keys
from cadence.transport.zmq_socket import LOCAL, listen_address


class LaunchError(RuntimeError):
    """An actor process failed or the run could not start."""


# what a run writes into its folder: a folder holding any of these holds a run
RUN_FILES = ("config.json", "metrics.jsonl", "eval.jsonl", "summary.json", "checkpoints", "logs", "samples")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse (`LaunchError`, one line) an `out` that is a file, or that holds a run while not `overwrite`."""
    if out.exists() and not out.is_dir():
        raise LaunchError(f"--out {out} is a file, not a folder")
    held = [name for name in RUN_FILES if (out / name).exists()]
    if held and not overwrite:
        raise LaunchError(
            f"{out} holds a run ({', '.join(held)}): give --overwrite to replace it, --resume {out} to"
            " continue it, or another --out"
        )


def prepare(
    cfg: RunConfig, out: Path, overwrite: bool = False, beyond: bool = False
) -> tuple[RunConfig, Path]:
    """Fresh run directory with the resolved config; earlier results in `out` are removed, which only
    `overwrite` allows (`LaunchError` otherwise). A run whose servers listen on TCP (`beyond`: its
    launcher says so; or `on_tcp`, loopback included) gets keys of its own unless it has some or
    opted out (`own_keys`)."""
    check_out(out, overwrite)
    cfg = dataclasses.replace(cfg, run_id=cfg.run_id or uuid.uuid4().hex[:12])
    out.mkdir(parents=True, exist_ok=True)
    cfg = own_keys(cfg, out, beyond or on_tcp(cfg.transport))
    for name in ("metrics.jsonl", "eval.jsonl", "summary.json", "dispatcher.addr", "publisher.addr"):
        (out / name).unlink(missing_ok=True)
    for name in ("logs", "checkpoints", "samples", "tensorboard"):
        shutil.rmtree(out / name, ignore_errors=True)
    path = out / "config.json"
    write_json(path, to_dict(cfg))
    make_run_secret(out)  # the trainer and publisher show it to the dispatcher
    return cfg, path


def resume_config(out: Path, config: Path | None, overrides: list[str]) -> RunConfig:
    """The config a resumed run in `out` goes on with: `out/config.json` (or `config`), the overrides on
    top, and the run's own id."""
    saved = out / "config.json"
    if not saved.is_file():
        raise ConfigError(f"{out} holds no config.json, so it is no run directory to resume")
    return dataclasses.replace(load_config(config or saved, overrides), run_id=load_config(saved).run_id)


def prepare_resume(cfg: RunConfig, out: Path) -> tuple[Path, int]:
    """Ready `out` to continue from its resume checkpoint: the config's path and the period to resume
    at. `metrics.jsonl` keeps the periods before it; logs stay."""
    try:
        found = find_resume(out / "checkpoints")
        if found is not None:
            check_files(found[0])
    except ResumeError as err:
        raise LaunchError(str(err)) from None
    if found is None:
        raise LaunchError(
            f"no resume checkpoint in {out / 'checkpoints' / 'resume'}: the run had"
            " trainer.checkpoint_every = 0, or stopped before its first checkpoint"
        )
    where, state = found
    try:
        check_config(state, RunRecord.of(cfg), where)
    except ResumeError as err:
        raise LaunchError(str(err)) from None
    version = int(state["version"])
    # the checkpoint carries the row of the period before it, which the dispatcher records again
    truncate_metrics(out / "metrics.jsonl", version - 1 if state.get("metrics") else version)
    for name in ("summary.json", "dispatcher.addr", "publisher.addr"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "checkpoints" / "final", ignore_errors=True)
    path = out / "config.json"
    write_json(path, to_dict(cfg))
    make_run_secret(out)  # a run made before secrets gets one now
    return path, version


OWN_KEYS = "keys"  # the run folder's own CURVE keys


def on_tcp(t: TransportConfig) -> bool:
    """Whether a server of the run listens on TCP: beyond loopback anyone who reaches the host may
    connect, on loopback any other user of the host (a Unix socket at `LOCAL` admits this user alone)."""
    return any(
        listen_address(t.listen, t.host, port, t.advertise_host) != LOCAL
        for port in (0, t.trainer_port, t.publisher_port)
    )


def own_keys(cfg: RunConfig, out: Path, exposed: bool) -> RunConfig:
    """`cfg`, with keys made in `out/keys` when its servers are `exposed` (on TCP), it names no
    `transport.keys` and has not opted out (`transport.unencrypted`); keys already there (a run
    replaced) are kept."""
    t = cfg.transport
    if not exposed or t.keys or t.unencrypted:
        return cfg
    folder = (out / OWN_KEYS).resolve()
    if not (folder / "server.key_secret").exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_keys(folder)
    return dataclasses.replace(cfg, transport=dataclasses.replace(t, keys=str(folder)))


def launch(
    cfg: RunConfig,
    out: Path,
    progress: bool = True,
    timeout_s: float = 3600.0,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the whole system (with `resume`, continue the run in `out` from its resume checkpoint;
    a new run replaces one in `out` only with `overwrite`); the summary when it succeeds,
    `LaunchError` otherwise."""
    if cfg.model.checkpoint:
        _check_model_checkpoint(Path(cfg.model.checkpoint).expanduser())
    if cfg.environment.name:  # a name that does not load stops the run here (ConfigError naming it)
        from cadence.tasks.environments.loading import load_environment

        load_environment(cfg.environment.name, kwargs=cfg.environment.kwargs)
    if cfg.environment.agent:
        from cadence.launch.build import load_agent

        load_agent(cfg.environment.agent)
    if resume:
        config_path, first = prepare_resume(cfg, out)
    else:
        (cfg, config_path), first = prepare(cfg, out, overwrite), 0
    again = ["--resume"] if resume else []
    base = [sys.executable, "-m", "cadence"]
    common = ["--config", str(config_path), "--out", str(out), "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **openmp_waits(os.environ)}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, args: list[str], ranks: int = 1) -> None:
        # several trainer ranks: torchrun starts them and the launcher watches torchrun
        head = torchrun(ranks, free_port(cfg.transport.host)) + ["-m", "cadence"] if ranks > 1 else base
        procs[name] = subprocess.Popen(
            head + args + common, env=env, start_new_session=True, preexec_fn=die_with_parent
        )

    begin = time.time()
    try:
        t = cfg.transport
        bind = listen_address(t.listen, t.host, 0, t.advertise_host)
        start("dispatcher", ["dispatcher", "--bind", bind, *again])
        address = _wait_for_address(out / "dispatcher.addr", procs["dispatcher"])
        start("trainer", ["trainer", "--connect", address, *again], cfg.trainer.ranks)
        for i in range(cfg.rollout.workers):
            start(f"rollout-{i}", ["rollout", "--connect", address, "--name", f"rollout-{i}"])
        if progress:
            print(first_line(cfg, out, len(procs), first if resume else None), flush=True)
        _watch(cfg, out, procs, progress, begin + timeout_s, first)
    finally:
        _stop_all(procs)
    summary: dict[str, Any] = read_json(out / "summary.json")
    return summary


def first_line(cfg: RunConfig, out: Path, processes: int, resumed: int | None) -> str:
    """The run's first line: where, its processes and mode, and what the trainer trains and publishes
    ("LoRA rank 16: 4.88M trainable parameters, 19.5 MB a version", or every weight's)."""
    from cadence.launch.build import version_figures

    params, nbytes = version_figures(cfg)
    where = f" resumed at period {resumed}," if resumed is not None else ""
    what = f"LoRA rank {cfg.trainer.lora.rank}: " if cfg.trainer.lora.rank else ""
    return (
        f"cadence: run {cfg.run_id} in {out}:{where} {processes} processes, {cfg.mode} mode,"
        f" {what}{params / 1e6:.2f}M trainable parameters, {nbytes / 1e6:.1f} MB a version"
    )


def _check_model_checkpoint(folder: Path) -> None:
    """A missing or damaged `model.checkpoint` named before any process starts."""
    from cadence.model.checkpoint import CheckpointError, check_checkpoint

    try:
        check_checkpoint(folder)
    except CheckpointError as err:
        raise LaunchError(f"model.checkpoint: {err}") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_for_address(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise LaunchError(f"dispatcher exited with status {proc.returncode} before binding")
        time.sleep(0.05)
    raise LaunchError(f"dispatcher did not bind within {timeout_s:.0f}s")


def _watch(
    cfg: RunConfig,
    out: Path,
    procs: dict[str, subprocess.Popen[bytes]],
    progress: bool,
    deadline: float,
    first: int = 0,
) -> None:
    shown = Progress(out, cfg.periods, cfg.task.prompts_per_period, sys.stdout, sys.stdout.isatty(), first)
    lost: set[str] = set()
    try:
        while True:
            if progress:
                shown.poll()
            for name, proc in procs.items():
                code = proc.poll()
                if code is None or code == 0 or name in lost:
                    continue
                if not name.startswith("rollout-"):
                    raise LaunchError(
                        f"{name} exited with status {code}{_failure(out, name)}; see {out / 'logs'}"
                    )
                lost.add(name)  # the dispatcher hands its prompts to the other workers
                shown.close()
                print(f"cadence: {name} exited with status {code}; {_without(cfg, procs, lost)}", flush=True)
            if procs["dispatcher"].poll() == 0:
                if not (out / "summary.json").exists():
                    raise LaunchError("dispatcher finished without a summary")
                if progress:
                    shown.poll()
                _wait_exit(procs, 15.0)
                return
            if time.time() > deadline:
                raise LaunchError("run timed out")
            time.sleep(0.2)
    finally:
        shown.close()


def _without(cfg: RunConfig, procs: dict[str, subprocess.Popen[bytes]], lost: set[str]) -> str:
    """What becomes of the run after the loss of a worker: the others take its prompts, or, with the
    last one gone, the dispatcher waits a while for one to join and then fails the run."""
    if any(n.startswith("rollout-") and n not in lost and p.poll() is None for n, p in procs.items()):
        return "the run goes on without it"
    return (
        "no rollout worker is left: the run fails unless one joins within rollout.wait_for_workers_s ="
        f" {cfg.rollout.wait_for_workers_s:g}s"
    )


def _failure(out: Path, name: str) -> str:
    """`: why`, from the last `actor_failed` event in the actor's log, or nothing."""
    path = out / "logs" / f"{name}.jsonl"
    with contextlib.suppress(OSError):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "actor_failed":
                    return f": {event.get('error', '')}"
    return ""


def _wait_exit(procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.time()))


def _stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    alive = [p for p in procs.values() if p.poll() is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + 5.0
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def run_command(cfg: RunConfig, out: Path, resume: bool = False, overwrite: bool = False) -> int:
    # Ctrl-C and `kill` stop the run and every actor. Set both explicitly: a shell that starts a
    # command in the background without job control leaves it with SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = launch(cfg, out, progress=True, resume=resume, overwrite=overwrite)
    except LaunchError as err:
        print(f"cadence: run failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cadence: interrupted; every process stopped", file=sys.stderr, flush=True)
        return 130
    keys = ("periods", "groups_trained", "reward_mean_first", "reward_mean_last", "stale_dropped", "wall_s")
    print("cadence: done  " + "  ".join(f"{k}={_fmt(summary[k])}" for k in keys), flush=True)
    print(
        f"cadence: summary in {out / 'summary.json'}, weights in {out / 'checkpoints' / 'final'}", flush=True
    )
    return 0


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
