"""`cadence slurm submit`: a run's folder, its sbatch scripts, and its jobs.

```
 check everything first, write nothing: --out holds no run; the config loads; sbatch is there; every
      partition named (control, rollout) exists and is large enough; `sbatch --test-only` takes both
      scripts (Slurm's own word on --time, --account, --qos, --sbatch-arg ...)
 then write DIR/config.json, DIR/slurm/*.sbatch ─► sbatch control ─► sbatch rollout × R
 a later sbatch refused all the same ─► scancel what was submitted, remove what this submit wrote
```

Invariant: a refused submission leaves no job and nothing in `--out` that it wrote, so the same
command can be given again; every job submitted is in `DIR/slurm/jobs.json` before the next one.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from cadence.config import RunConfig, load_config
from cadence.launch.launcher import LaunchError, check_out, prepare
from cadence.launch.slurm.allocation import SlurmError
from cadence.launch.slurm.commands import add_workers
from cadence.launch.slurm.jobs import Runner, partition_nodes, record_job, run_command, sbatch, scancel
from cadence.launch.slurm.scripts import SubmitOptions, control_script, rollout_script

WRITTEN = ("config.json", "slurm", "keys", "run.secret")
"""What `submit` writes into `--out` (`prepare` and the scripts), removed again if it is refused."""


def test_only(script: str, run: Runner = run_command) -> None:
    """`sbatch --test-only` of `script` (written to a temporary file): Slurm's refusal, if any, as a
    `SlurmError` with Slurm's words; nothing is submitted."""
    with tempfile.TemporaryDirectory(prefix="cadence-sbatch-") as folder:
        path = Path(folder) / "job.sbatch"
        path.write_text(script)
        run(["sbatch", "--test-only", str(path)])


def check_submission(opts: SubmitOptions, control: str, rollout: str, run: Runner = run_command) -> None:
    """Everything Slurm can tell before a job is submitted: the partitions and the scripts."""
    if run is run_command and shutil.which("sbatch") is None:
        raise SlurmError("sbatch is not on PATH: submit from a host of the cluster with Slurm's client")
    name, size = partition_nodes(opts.partition, run)
    if opts.trainer_nodes > size:
        raise SlurmError(f"--trainer-nodes {opts.trainer_nodes}: partition {name} has {size} nodes")
    if opts.rollout_partition:
        try:
            partition_nodes(opts.rollout_partition, run)
        except SlurmError as err:
            raise SlurmError(f"--rollout-partition: {err}") from None
    for role, script in (("control", control), ("rollout", rollout)):
        try:
            test_only(script, run)
        except SlurmError as err:
            raise SlurmError(f"Slurm refuses the {role} job: {err}") from None


def submit(
    config: Path,
    overrides: Sequence[str],
    out: Path,
    opts: SubmitOptions,
    dry_run: bool = False,
    run: Runner = run_command,
    say: Callable[[str], None] = print,
) -> list[dict[str, str]]:
    """Check, then write the run's folder and scripts and submit its jobs (with `dry_run`, print them
    instead and touch nothing); the jobs submitted."""
    try:
        check_out(out, overwrite=False)
    except LaunchError as err:
        raise SlurmError(str(err)) from None
    ranks = opts.trainer_nodes * opts.ranks_per_node
    cfg = load_config(config, overrides, {"trainer.ranks": ranks} if ranks > 1 else {})
    out = out.resolve()
    cfg = dataclasses.replace(cfg, run_id=cfg.run_id or uuid.uuid4().hex[:12])  # kept by `prepare`
    control = control_script(out, cfg.run_id, opts, sys.executable)
    rollout = rollout_script(out, cfg.run_id, opts, sys.executable)
    if dry_run:
        say(f"# {out / 'slurm' / 'control.sbatch'}\n{control}")
        say(f"# {out / 'slurm' / 'rollout.sbatch'}\n{rollout}")
        say(f"sbatch --parsable {out / 'slurm' / 'control.sbatch'}")
        for _ in range(opts.rollout_jobs):
            say(f"sbatch --parsable --dependency=after:<control job> {out / 'slurm' / 'rollout.sbatch'}")
        return []
    check_submission(opts, control, rollout, run)
    if cfg.trainer.checkpoint_every <= 0:
        say("cadence: trainer.checkpoint_every = 0: a control job requeued without its time-limit signal"
            " (a node failure) cannot resume, and fails rather than count periods twice")  # fmt: skip
    fresh = not out.exists()
    written = [name for name in WRITTEN if not (out / name).exists()]
    submitted: list[dict[str, str]] = []
    try:
        return _submit(cfg, out, opts, control, rollout, run, say, submitted)
    except (SlurmError, OSError) as err:
        _undo(out, fresh, written, submitted, run, say)
        raise SlurmError(f"{err} (nothing of this submission is left)") from None


def _submit(
    cfg: RunConfig,
    out: Path,
    opts: SubmitOptions,
    control: str,
    rollout: str,
    run: Runner,
    say: Callable[[str], None],
    submitted: list[dict[str, str]],
) -> list[dict[str, str]]:
    cfg, _ = prepare(cfg, out, beyond=True)  # its actors bind the nodes' addresses: keys of its own
    folder = out / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "control.sbatch").write_text(control)
    (folder / "rollout.sbatch").write_text(rollout)
    (folder / "options.json").write_text(json.dumps(opts.__dict__, default=list, indent=1) + "\n")
    control_id = sbatch(folder / "control.sbatch", [], run)
    submitted.append({"id": control_id, "role": "control"})
    record_job(out, control_id, "control")
    say(f"cadence: control job {control_id} (dispatcher, trainer) for run {cfg.run_id} in {out}")
    if opts.rollout_jobs:
        add_workers(out, opts.rollout_jobs, after=control_id, run=run, say=say, submitted=submitted)
    return submitted


def _undo(
    out: Path,
    fresh: bool,
    written: list[str],
    submitted: list[dict[str, str]],
    run: Runner,
    say: Callable[[str], None],
) -> None:
    """A submission refused half-way: cancel its jobs, remove what it wrote (nothing else)."""
    ids = [j["id"] for j in submitted]
    if ids:
        try:
            scancel(ids, run)
            say(f"cadence: cancelled {', '.join(ids)}, submitted before the refusal")
        except SlurmError as err:
            say(f"cadence: could not cancel {', '.join(ids)}: {err}; scancel them yourself")
    for name in written:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if fresh and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
