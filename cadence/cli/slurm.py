"""`cadence slurm …`: a run on a Slurm cluster (cadence/launch/slurm/). `submit`, `add-workers`,
`status` and `stop` run on a login node; `task` is what the sbatch scripts run on the nodes."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cadence.cli.common import Subparsers, refuse


def add(sub: Subparsers) -> None:
    slurm = sub.add_parser("slurm", help="run on a Slurm cluster: submit, add workers, status, stop")
    verbs = slurm.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("submit", help="write the run's folder and sbatch scripts, and submit its jobs")
    s.add_argument("config", type=Path, help="TOML run configuration")
    s.add_argument(
        "--out", type=Path, required=True, help="the run's folder, on a filesystem every node sees"
    )
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument(
        "--trainer-nodes", type=int, default=1, help="nodes of the control job (the trainer's ranks)"
    )
    s.add_argument(
        "--gpus-per-node", type=int, default=0, help="GPUs a node of each job (a trainer rank each)"
    )
    s.add_argument("--rollout-jobs", type=int, default=1, help="rollout jobs, one worker each")
    for name in ("partition", "rollout-partition", "account", "time", "qos", "rollout-qos", "ifname"):
        s.add_argument(f"--{name}", default="")
    s.add_argument("--cpus-per-task", type=int, default=0, help="cores a node's task may use")
    s.add_argument(
        "--sbatch-arg", dest="sbatch_args", action="append", default=[], help="another #SBATCH line"
    )
    s.add_argument("--dry-run", action="store_true", help="print the scripts and commands; submit nothing")
    s.set_defaults(handler=submit_handler)
    t = verbs.add_parser("task", help="(in a job) what one node of the run does")
    t.add_argument("--role", choices=["control", "rollout"], required=True)
    t.add_argument("out", type=Path)
    t.add_argument(
        "--ifname", default="", help="the network interface to advertise (default: the routed one)"
    )
    t.set_defaults(handler=task_handler)
    a = verbs.add_parser("add-workers", help="more rollout jobs that join the running run")
    a.add_argument("out", type=Path)
    a.add_argument("--count", type=int, default=1)
    a.add_argument("--partition", default="")
    a.set_defaults(handler=add_workers_handler)
    st = verbs.add_parser(
        "status", help="each job's Slurm state, the dispatcher's view of its worker, the last metrics row"
    )
    st.add_argument("out", type=Path)
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=status_handler)
    sp = verbs.add_parser("stop", help="end the run cleanly (its summary written), then cancel its jobs")
    sp.add_argument("out", type=Path)
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the run to end")
    sp.set_defaults(handler=stop_handler)


def submit_handler(args: argparse.Namespace) -> int:
    from cadence.launch.slurm.allocation import SlurmError
    from cadence.launch.slurm.scripts import SubmitOptions
    from cadence.launch.slurm.submit import submit

    opts = SubmitOptions(
        trainer_nodes=args.trainer_nodes,
        gpus_per_node=args.gpus_per_node,
        rollout_jobs=args.rollout_jobs,
        partition=args.partition,
        rollout_partition=args.rollout_partition,
        account=args.account,
        time=args.time,
        qos=args.qos,
        rollout_qos=args.rollout_qos,
        sbatch_args=tuple(args.sbatch_args),
        ifname=args.ifname,
        cpus_per_task=args.cpus_per_task,
    )
    if args.trainer_nodes < 1:
        return refuse(f"--trainer-nodes {args.trainer_nodes}: at least 1")
    if args.rollout_jobs < 0 or args.gpus_per_node < 0:
        return refuse("--rollout-jobs and --gpus-per-node: 0 or more")
    try:
        submit(args.config, args.overrides, args.out, opts, args.dry_run)
    except SlurmError as err:
        return refuse(str(err))
    return 0


def task_handler(args: argparse.Namespace) -> int:
    from cadence.launch.slurm.allocation import SlurmError, allocation_from_env
    from cadence.launch.slurm.rollout import rollout_task
    from cadence.launch.slurm.task import control_task
    from cadence.log import configure_logging

    try:
        alloc = allocation_from_env(os.environ)
    except SlurmError as err:
        return refuse(str(err))
    name = f"slurm-{args.role}-{alloc.job_id}-{alloc.node_index}"
    configure_logging(name, args.out / "logs", "info", None)
    try:
        if args.role == "control":
            return control_task(args.out, alloc, args.ifname)
        return rollout_task(args.out, alloc, os.environ)
    except SlurmError as err:
        return refuse(str(err))


def add_workers_handler(args: argparse.Namespace) -> int:
    from cadence.launch.slurm.allocation import SlurmError
    from cadence.launch.slurm.commands import add_workers

    try:
        add_workers(args.out.resolve(), args.count, args.partition)
    except (SlurmError, OSError) as err:  # OSError: the run folder unreadable or its disk full
        return refuse(str(err))
    return 0


def status_handler(args: argparse.Namespace) -> int:
    from cadence.launch.slurm.allocation import SlurmError
    from cadence.launch.slurm.commands import status

    try:
        state = status(args.out.resolve())
    except (SlurmError, OSError) as err:  # OSError: the run folder unreadable or its disk full
        return refuse(str(err))
    if args.json:
        print(json.dumps(state))
        return 0
    for job in state["jobs"]:
        seen = f"  dispatcher: {job['worker']}" if "worker" in job else ""
        if job.get("weights_from"):
            seen += f"  weights: {job['weights_from']}"
        print(f"{job['id']:>10}  {job['role']:<8} {job['state']:<12} {job['where']}{seen}")
    row = state["last_period"]
    if row is not None:
        print(f"period {row['period']}  reward {row['reward_mean']:.3f}  workers {row.get('workers', '?')}")
    print(
        RUN_STATES[state["run"]].format(
            out=args.out,
            periods=state["periods"],
            dispatcher_silent_s=state["dispatcher_silent_s"],
            **state["control"],
        )
    )
    return 0


RUN_STATES = {
    "going": "run going",
    "ended": "run ended",
    "waiting": "run waiting: its control job {id} is {state}",
    "silent": "run silent: its control job {id} is {state} to Slurm, but its dispatcher has given no sign of"
    " life for {dispatcher_silent_s}s (its node or process gone? Slurm notices a dead node after its"
    " SlurmdTimeout)",
    "dead": "run dead: its control job {id} is {state} and the run did not end (no summary.json);"
    " metrics.jsonl holds {periods} periods; `cadence slurm stop {out}` writes their summary",
}


def stop_handler(args: argparse.Namespace) -> int:
    from cadence.launch.slurm.allocation import SlurmError
    from cadence.launch.slurm.commands import stop

    try:
        stop(args.out.resolve(), args.timeout)
    except (SlurmError, OSError) as err:  # OSError: the run folder unreadable or its disk full
        return refuse(str(err))
    return 0
