"""The Slurm launcher's logic, by faking what Slurm gives a task (`SLURM_*`) and what its client
commands answer: which node runs what, which address it advertises, what is submitted and recorded."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cadence.launch.slurm.allocation import Allocation, SlurmError, allocation_from_env, expand_hostlist
from cadence.launch.slurm.commands import add_workers, status, stop
from cadence.launch.slurm.interfaces import choose_address, interface_addresses
from cadence.launch.slurm.jobs import partition_nodes, read_jobs, sbatch
from cadence.launch.slurm.rollout import worker_name
from cadence.launch.slurm.scripts import SubmitOptions, control_script, rollout_script
from cadence.launch.slurm.submit import submit
from cadence.launch.slurm.task import network_env, should_resume
from tests.unit.fake_slurm import FakeSlurm

ROOT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-2,7],gpu-a[08-10]", ["n1", "n2", "n7", "gpu-a08", "gpu-a09", "gpu-a10"]),
        ("a,b[3],c", ["a", "b3", "c"]),
        ("rack[1-2]-x", ["rack1-x", "rack2-x"]),
    ],
)
def test_a_hostlist_expands_as_scontrol_does(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


def test_a_task_reads_its_allocation_from_slurm_variables() -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_NODEID": "2",
        "SLURM_RESTART_COUNT": "1",
    }
    alloc = allocation_from_env({**env, "SLURM_SUBMIT_HOST": "login"})
    assert alloc == Allocation("42", ("n1", "n2", "n3"), 2, 1, "login") and not alloc.first
    assert allocation_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n4"}).first
    with pytest.raises(SlurmError, match="SLURM_JOB_ID is not set"):
        allocation_from_env({})
    with pytest.raises(SlurmError, match="SLURM_NODEID = 5, but the job has 3 nodes"):
        allocation_from_env({**env, "SLURM_NODEID": "5"})
    with pytest.raises(SlurmError, match="SLURM_RESTART_COUNT = 'x' is not a count"):
        allocation_from_env({**env, "SLURM_RESTART_COUNT": "x"})


TABLE = {"eth0": "10.0.0.5", "ib0": "192.168.7.5"}


def test_the_address_is_the_routed_interfaces_never_loopback_never_a_name() -> None:
    routes = {"n2": "192.168.7.5", "login": "10.0.0.5", "lost": None}

    def choose(ifname: str, toward: list[str]) -> tuple[str, str]:
        return choose_address(ifname, toward, lambda: TABLE, routes.get)

    assert choose("", ["n2", "login"]) == ("ib0", "192.168.7.5")  # toward the other nodes first
    assert choose("", ["lost", "login"]) == ("eth0", "10.0.0.5")
    assert choose("eth0", ["n2"]) == ("eth0", "10.0.0.5")  # the user's choice wins
    assert choose("", []) == ("eth0", "10.0.0.5")  # none routed: the first interface by name
    with pytest.raises(SlurmError, match="--ifname ib1: no such interface .*up: eth0, ib0"):
        choose("ib1", [])
    # a route through loopback (the target is this host) is no answer
    assert choose_address("", ["me"], lambda: TABLE, lambda _: "127.0.0.1") == ("eth0", "10.0.0.5")
    with pytest.raises(SlurmError, match="name one with --ifname"):
        choose_address("", ["n2"], dict, routes.get)


def test_this_machines_interfaces_leave_loopback_out() -> None:
    assert all(not address.startswith("127.") for address in interface_addresses().values())


def test_the_collectives_use_the_chosen_interface_unless_the_user_set_one() -> None:
    env = network_env({"NCCL_SOCKET_IFNAME": "ib0", "PATH": "/bin"}, "eth0")
    assert env == {
        "NCCL_SOCKET_IFNAME": "ib0",
        "PATH": "/bin",
        "GLOO_SOCKET_IFNAME": "eth0",
        "HCCL_SOCKET_IFNAME": "eth0",
    }


def test_a_requeued_rollout_job_keeps_its_workers_name() -> None:
    first = Allocation("77", ("n3",), 0, 0)
    again = Allocation("77", ("n2",), 0, 1)  # requeued onto another node
    assert worker_name(first) == worker_name(again) == "rollout-77"
    assert worker_name(Allocation("78", ("n1", "n2"), 1)) == "rollout-78-1"


def test_a_control_job_resumes_when_requeued_or_when_the_run_has_periods(tmp_path: Path) -> None:
    fresh, requeued = Allocation("1", ("n1",), 0, 0), Allocation("1", ("n1",), 0, 1)
    assert not should_resume(tmp_path, requeued)  # no checkpoint and no period: nothing to resume
    (tmp_path / "checkpoints" / "resume").mkdir(parents=True)
    (tmp_path / "checkpoints" / "resume" / "state.json").write_text('{"version": 1}')
    assert should_resume(tmp_path, requeued) and not should_resume(tmp_path, fresh)
    (tmp_path / "metrics.jsonl").write_text('{"period": 0}\n')
    assert should_resume(tmp_path, fresh)


def test_a_requeued_control_job_never_starts_over_a_run_that_has_periods(tmp_path: Path) -> None:
    """trainer.checkpoint_every = 0 and a requeue (a node failed, scontrol requeue): the periods in
    metrics.jsonl would be recorded again from period 0, so the job refuses, saying why."""
    (tmp_path / "metrics.jsonl").write_text('{"period": 0}\n{"period": 1}\n')
    with pytest.raises(
        SlurmError, match="no resume checkpoint to go on from.*restart 1.*count its periods twice"
    ):
        should_resume(tmp_path, Allocation("9", ("n1",), 0, 1))
    assert (tmp_path / "metrics.jsonl").read_text().count("period") == 2  # nothing lost


def test_the_scripts_are_a_few_lines_a_slurm_user_recognises(tmp_path: Path) -> None:
    opts = SubmitOptions(
        trainer_nodes=2,
        gpus_per_node=4,
        partition="gpu",
        rollout_partition="spot",
        account="proj",
        time="02:00:00",
        qos="high",
        rollout_qos="low",
        sbatch_args=("--exclusive", "--mem=0"),
        ifname="ib0",
    )
    control = control_script(tmp_path, "r1", opts, "/venv/bin/python").splitlines()
    assert control[0] == "#!/bin/bash" and len(control) < 20
    for line in ("--nodes=2", "--gpus-per-node=4", "--partition=gpu", "--qos=high", "--signal=USR1@120"):
        assert f"#SBATCH {line}" in control, line
    assert (
        "#SBATCH --requeue" in control and "#SBATCH --exclusive" in control and "#SBATCH --mem=0" in control
    )
    assert control[-1].endswith(f"cadence slurm task --role control {tmp_path} --ifname ib0")
    rollout = rollout_script(tmp_path, "r1", opts, "/venv/bin/python").splitlines()
    assert "#SBATCH --partition=spot" in rollout and "#SBATCH --qos=low" in rollout
    assert "#SBATCH --nodes=1" in rollout and "#SBATCH --account=proj" in rollout
    assert (
        rollout[-1]
        == f"exec srun --kill-on-bad-exit=1 /venv/bin/python -m cadence slurm task --role rollout {tmp_path}"
    )


def test_submit_writes_the_run_and_records_every_job_it_submitted(tmp_path: Path) -> None:
    slurm, said = FakeSlurm(), list[str]()
    out = tmp_path / "run"
    jobs = submit(ROOT_CONFIG, ["periods=7"], out, SubmitOptions(rollout_jobs=2), run=slurm, say=said.append)
    assert [(j["id"], j["role"]) for j in jobs] == [
        ("101", "control"),
        ("102", "rollout"),
        ("103", "rollout"),
    ]
    assert read_jobs(out) == jobs
    config = json.loads((out / "config.json").read_text())
    assert config["periods"] == 7 and config["run_id"]  # the run id fixed before any job starts
    assert f"cadence-control-{config['run_id']}" in (out / "slurm" / "control.sbatch").read_text()
    sbatches = slurm.submitted()
    assert sbatches[0] == ["sbatch", "--parsable", str(out / "slurm" / "control.sbatch")]
    assert all("--dependency=after:101" in c for c in sbatches[1:])  # workers once the control job runs
    with pytest.raises(SlurmError, match="holds a run"):
        submit(ROOT_CONFIG, [], out, SubmitOptions(), run=slurm, say=said.append)
    more = add_workers(out, 1, partition="spot", run=slurm, say=said.append)
    assert more == [{"id": "104", "role": "rollout"}] and read_jobs(out)[-1] == more[0]
    assert "--partition=spot" in slurm.calls[-1]
    slurm.queue["101"] = "RUNNING"
    state = status(out, run=slurm)
    assert [(j["id"], j["state"]) for j in state["jobs"]][:2] == [("101", "RUNNING"), ("102", "PENDING")]
    assert state["last_period"] is None and not state["ended"]
    row = {"period": 0, "reward_mean": 0.5, "weights_from": {"rollout-102": "shm", "rollout-103": "zmq"}}
    (out / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    state = status(out, run=slurm)  # how each rollout job's worker had its weights, in the last row
    assert [j.get("weights_from") for j in state["jobs"]] == [None, "shm", "zmq", ""]


def test_submit_gives_the_trainer_a_rank_a_gpu_of_its_nodes_whatever_the_config_says(tmp_path: Path) -> None:
    opts = SubmitOptions(trainer_nodes=2, gpus_per_node=2)
    submit(ROOT_CONFIG, ["trainer.ranks=3"], tmp_path / "run", opts, run=FakeSlurm(), say=print)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["trainer"]["ranks"] == 4


def test_submit_refuses_what_cannot_run_and_a_dry_run_touches_nothing(tmp_path: Path) -> None:
    slurm, said = FakeSlurm(nodes=3), list[str]()
    with pytest.raises(SlurmError, match="--trainer-nodes 4: partition main has 3 nodes"):
        submit(ROOT_CONFIG, [], tmp_path / "a", SubmitOptions(trainer_nodes=4), run=slurm, say=said.append)
    with pytest.raises(SlurmError, match="partition 'gpu' is not one of this cluster's: main, spot"):
        partition_nodes("gpu", slurm)
    assert not (tmp_path / "a").exists()
    submit(
        ROOT_CONFIG,
        [],
        tmp_path / "b",
        SubmitOptions(trainer_nodes=2),
        dry_run=True,
        run=slurm,
        say=said.append,
    )
    assert not (tmp_path / "b").exists() and not slurm.submitted()
    assert any("#SBATCH --nodes=2" in s for s in said)
    with pytest.raises(SlurmError, match="is not a Slurm run"):
        add_workers(tmp_path, 1, run=slurm)
    with pytest.raises(SlurmError, match="is not a Slurm run"):
        stop(tmp_path, run=slurm)


def test_stop_and_add_workers_refuse_a_run_that_has_ended(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    out = tmp_path / "run"
    submit(ROOT_CONFIG, [], out, SubmitOptions(rollout_jobs=0), run=slurm, say=lambda _: None)
    (out / "summary.json").write_text("{}")
    for action in (lambda: add_workers(out, 1, run=slurm), lambda: stop(out, run=slurm)):
        with pytest.raises(SlurmError, match="has ended"):
            action()


def test_sbatch_without_a_job_id_is_an_error(tmp_path: Path) -> None:
    def answer(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 0, "Submitted nothing\n", "")

    with pytest.raises(SlurmError, match="no job id"):
        sbatch(tmp_path / "x.sbatch", [], answer)


def test_submit_without_slurms_client_says_so_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SlurmError, match="sbatch is not on PATH"):
        submit(ROOT_CONFIG, [], tmp_path / "run", SubmitOptions())
    assert not (tmp_path / "run").exists()
