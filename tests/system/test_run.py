"""The whole system from the command line: real processes, real sockets on loopback."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadence.launch.threads import host_cores
from cadence.monitor.run_dir import read_jsonl
from tests.system.gate import GATE_ENV, GATE_SETTINGS
from tests.system.helpers import SMALL, Launched, cadence, events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quick")
    cadence("run", "configs/quickstart.toml", "--out", str(out), "--set", "periods=5", *SMALL)
    return out


def test_run_directory_is_complete(quick_run: Path) -> None:
    s = summary(quick_run)
    for key in [
        "periods",
        "groups_trained",
        "samples",
        "tokens_generated",
        "reward_mean_first",
        "reward_mean_last",
        "stale_dropped",
        "duplicates_dropped",
        "wall_s",
        "mode",
        "final_version",
        "weights_sha256",
    ]:
        assert key in s, key
    assert s["periods"] == 5 and s["groups_trained"] == 5 * 4 and s["samples"] == 5 * 4 * 4
    assert s["stale_dropped"] == 0 and s["final_version"] == 5 and s["mode"] == "periodic"
    assert 0.0 <= s["reward_mean_first"] <= 1.0 and 0.0 <= s["reward_mean_last"] <= 1.0
    config = json.loads((quick_run / "config.json").read_text())
    assert config["periods"] == 5 and config["run_id"]
    rows = read_jsonl(quick_run / "metrics.jsonl")
    assert [r["period"] for r in rows] == [0, 1, 2, 3, 4]
    for key in (
        "reward_mean",
        "gen_s",
        "train_s",
        "overlap_s",
        "weight_sync_s",
        "tokens_per_s",
        "stale_dropped",
    ):
        assert all(key in r for r in rows), key
    final = quick_run / "checkpoints" / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert load_file(str(final / "model.safetensors"))


def test_workers_on_the_trainers_host_map_each_version_and_leave_nothing_behind(quick_run: Path) -> None:
    rows = read_jsonl(quick_run / "metrics.jsonl")
    # whose groups a period trained depends on which worker was quicker (one may generate them all)
    said = {w: how for r in rows for w, how in (r["weights_from"] or {}).items()}
    assert said and set(said) <= {"rollout-0", "rollout-1"} and set(said.values()) == {"shm"}, said
    loads = [
        e for w in ("rollout-0", "rollout-1") for e in events(quick_run, w) if e["event"] == "weights_loaded"
    ]
    assert {e["source"] for e in loads} == {"shm"} and len(loads) >= 2
    assert _slots_left(quick_run) == []


def test_every_actor_ran_in_its_own_process(quick_run: Path) -> None:
    pids = {
        actor: {e["pid"] for e in events(quick_run, actor)}
        for actor in ("dispatcher", "trainer", "rollout-0", "rollout-1")
    }
    assert all(len(p) == 1 for p in pids.values())
    assert len(set().union(*pids.values())) == 4
    assert len({e["pid"] for e in events(quick_run, "trainer")} | {os.getpid()}) == 2


def test_logs_merge_every_actor_in_time_order(quick_run: Path) -> None:
    lines = cadence("logs", str(quick_run)).stdout.splitlines()
    out = [line for line in lines if not line.startswith(" ")]  # an event's traceback lines are indented
    actors = {line.split()[1] for line in out}
    assert {"dispatcher", "trainer", "rollout-0", "rollout-1"} <= actors
    stamps = [line.split()[0] for line in out]
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(
    ("dtype", "precision", "workers"),
    [("float32", "fp32", 2), ("bfloat16", "fp32", 2), ("float32", "bf16", 2), ("float32", "fp32", 1)],
    ids=["fp32", "bf16-rollouts", "bf16-training", "one-worker"],
)
def test_sync_and_periodic_processes_agree(tmp_path: Path, dtype: str, precision: str, workers: int) -> None:
    """Two worker processes racing, in prompt order (`sampling.order`): the same tokens and the same
    final weights, to the bit. bfloat16 rollouts: the workers generate in it, and every version is
    published in it; bf16 training: the trainer's forwards and backwards under bf16 autocast. One
    worker: it may take the cores the waiting trainer leaves (where its engine computes alike with
    them), in sync mode all the while it generates, in periodic mode whenever the trainer's activity
    says it waits, its thread count then changing between two decode steps."""
    rows, weights = {}, {}
    for mode in ("sync", "periodic"):
        out = tmp_path / mode
        cadence(
            "run",
            "configs/quickstart.toml",
            "--out",
            str(out),
            "--set",
            f"mode={mode}",
            "--set",
            "periods=4",
            "--set",
            f"rollout.workers={workers}",
            "--set",
            "sampling.order='prompt'",
            "--set",
            "seed=3",
            "--set",
            f"rollout.dtype={dtype!r}",
            "--set",
            f"trainer.precision={precision!r}",
            *SMALL,
        )
        rows[mode] = [r["samples_sha256"] for r in read_jsonl(out / "metrics.jsonl")]
        weights[mode] = load_file(str(out / "checkpoints" / "final" / "model.safetensors"))
    assert rows["sync"] == rows["periodic"] and len(set(rows["sync"])) == 4
    assert all(torch.equal(weights["sync"][k], weights["periodic"][k]) for k in weights["sync"])
    # every version a worker loaded held the weights in the workers' precision (and a header); which
    # of two racing workers got the prompts (and loaded versions at all) is the race's
    payload = sum(t.numel() for t in weights["sync"].values()) * {"float32": 4, "bfloat16": 2}[dtype]
    loaded = [
        e["nbytes"]
        for worker in range(workers)
        for e in events(tmp_path / "periodic", f"rollout-{worker}")
        if e["event"] == "weights_loaded"
    ]
    assert loaded and all(payload < n < payload + 8192 for n in loaded)
    if workers == 1 and host_cores() >= 2:  # each worker asked once whether it may take every core
        for mode in ("sync", "periodic"):
            asked = [e for e in events(tmp_path / mode, "rollout-0") if e["event"] == "rollout_threads"]
            assert [(e["share"], e["alone"]) for e in asked] == [(host_cores() // 2, host_cores())]


def test_bad_config_names_the_key() -> None:
    proc = cadence("run", "configs/quickstart.toml", "--set", "rollout.wrokers=2", check=False)
    assert proc.returncode == 2 and "rollout.wrokers" in proc.stderr
    proc = cadence("run", "configs/quickstart.toml", "--set", "mode=fast", check=False)
    assert proc.returncode == 2 and "'periodic'" in proc.stderr and "mode" in proc.stderr


def _wait_up(
    run_dir: Path, run: Launched, timeout: float = 120, actors: int = 4, first_period: bool = True
) -> dict[str, int]:
    """Once every actor has logged (and the first period is done, with `first_period`): each actor's pid."""

    def pids() -> dict[str, int]:
        logs = sorted((run_dir / "logs").glob("*.jsonl")) if (run_dir / "logs").is_dir() else []
        return {p.stem: int(events(run_dir, p.stem)[0]["pid"]) for p in logs if p.stat().st_size}

    wait_until(
        lambda: len(pids()) == actors and (not first_period or read_jsonl(run_dir / "metrics.jsonl")),
        timeout,
        "first period",
        run.proc,
    )
    return pids()


def _slots_left(run_dir: Path) -> list[str]:
    """Every trace of the run's shared versions still on this host: a name in /dev/shm, or a process
    holding a slot (a descriptor or a mapping). The prefix of its slots is in the trainer's log."""
    (shared,) = [e for e in events(run_dir, "trainer") if e["event"] == "weights_shared"]
    prefix = shared["slots"]
    left = [f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if prefix in name]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            maps = (proc / "maps").read_text()
        except OSError:  # gone meanwhile, or another user's
            continue
        left += [f"{proc.name}: {link}" for link in links if prefix in link]
        left += [f"{proc.name} maps {prefix}" for _ in range(prefix in maps)]
    return left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_stops_every_process(tmp_path: Path, signum: int) -> None:
    proc = start_run(tmp_path, "--set", "periods=1000000")  # never ends by itself
    try:
        children = set(_wait_up(tmp_path, proc).values())
        assert len(children) == 4 and all(_alive(p) for p in children)
        proc.proc.send_signal(signum)
        code, out, err = proc.finish(timeout=60)
        assert code == 130, (out, err)
        assert "interrupted; every process stopped" in err
        assert not [p for p in children if _alive(p)]  # the launcher waited for each before it said so
        assert not (tmp_path / "summary.json").exists()
    finally:
        proc.kill()


def test_a_killed_worker_is_named_and_the_run_completes_without_it(tmp_path: Path) -> None:
    periods = 40
    proc = start_run(
        tmp_path,
        "--set",
        f"periods={periods}",
        "--set",
        "transport.heartbeat_s=0.1",
        "--set",
        "transport.liveness=10",
    )
    try:
        os.kill(_wait_up(tmp_path, proc)["rollout-1"], signal.SIGKILL)
        code, out, err = proc.finish(timeout=240)
    finally:
        proc.kill()
    assert code == 0, err
    assert "rollout-1 exited" in out
    assert _slots_left(tmp_path) == []
    s = summary(tmp_path)
    assert s["groups_trained"] == periods * 4 and s["stale_dropped"] == 0
    lost = [e for e in events(tmp_path, "dispatcher") if e["event"] == "worker_lost"]
    assert [e["peer"] for e in lost] == ["rollout-1"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["workers_active"] == 1


def test_a_worker_stopped_past_its_liveness_says_it_was_paused_not_that_the_dispatcher_was_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run scores nothing until the stopped worker has said it was paused: a run that ended first
    would have stopped it before it could."""
    out, gate = tmp_path / "run", tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    settings = ["periods=40", "transport.heartbeat_s=0.2", "transport.liveness=10"]
    proc = start_run(out, *[x for s in settings for x in ("--set", s)], *GATE_SETTINGS)
    try:
        pid = _wait_up(out, proc, first_period=False)["rollout-1"]
        joined = lambda: [e for e in events(out, "dispatcher") if e["event"] == "peer_joined"]  # noqa: E731
        wait_until(lambda: "rollout-1" in {e["peer"] for e in joined()}, 120, "rollout-1 joined", proc.proc)
        os.kill(pid, signal.SIGSTOP)
        try:

            def lost() -> list[dict[str, object]]:
                return [e for e in events(out, "dispatcher") if e["event"] == "worker_lost"]

            wait_until(lost, 120, "the stopped worker declared lost", proc.proc)
        finally:
            os.kill(pid, signal.SIGCONT)
        said = lambda: [e for e in events(out, "rollout-1") if e["event"] == "process_paused"]  # noqa: E731
        wait_until(said, 120, "the worker to say it was paused", proc.proc)
        gate.touch()
        code, stdout, err = proc.finish(timeout=240)
    finally:
        proc.kill()
    assert code == 0, err
    assert "rollout-1 exited with status 1; the run goes on without it" in stdout
    log = events(out, "rollout-1")
    (paused,) = [e for e in log if e["event"] == "process_paused"]
    (failed,) = [e for e in log if e["event"] == "actor_failed"]
    assert paused["paused_s"] >= 1.0 and failed["error"].startswith("Paused: this rollout was paused for")
    assert "silent" not in failed["error"] and summary(out)["groups_trained"] == 40 * 4


def test_a_run_whose_only_worker_dies_fails_within_wait_for_workers_s_naming_it(tmp_path: Path) -> None:
    wait = 3
    proc = start_run(
        tmp_path,
        "--set",
        "periods=1000000",  # never ends by itself
        "--set",
        "rollout.workers=1",
        "--set",
        f"rollout.wait_for_workers_s={wait}",
        "--set",
        "transport.heartbeat_s=0.1",
        "--set",
        "transport.liveness=10",
    )
    try:
        os.kill(_wait_up(tmp_path, proc, actors=3)["rollout-0"], signal.SIGKILL)
        code, out, err = proc.finish(timeout=120)  # a bound, generous under load; the run would hang
    finally:
        proc.kill()
    assert code == 1, (out, err)
    assert "goes on without it" not in out
    assert "rollout-0 exited with status -9; no rollout worker is left" in out
    failed = [line for line in err.splitlines() if line.startswith("cadence: run failed:")]
    assert len(failed) == 1, err
    assert "no rollout worker left" in failed[0] and "lost workers: rollout-0" in failed[0]
    assert f"rollout.wait_for_workers_s = {wait}" in failed[0]
    (event,) = [e for e in events(tmp_path, "dispatcher") if e["event"] == "no_workers_left"]
    assert event["lost"] == ["rollout-0"] and event["waited_s"] >= wait


def test_a_folder_holding_a_run_is_refused_and_kept(quick_run: Path) -> None:
    before = {p: p.read_bytes() for p in quick_run.rglob("*") if p.is_file()}
    refused = cadence("run", "configs/quickstart.toml", "--out", str(quick_run), *SMALL, check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "holds a run" in refused.stderr
    assert "--overwrite" in refused.stderr and f"--resume {quick_run}" in refused.stderr
    assert {p: p.read_bytes() for p in quick_run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "mistake", ["missing config", "out is a file", "empty state.json", "broken checkpoint"]
)
def test_a_users_mistake_is_one_line_naming_the_path(tmp_path: Path, mistake: str) -> None:
    config, out = "configs/quickstart.toml", tmp_path / "run"
    extra: list[str] = []
    if mistake == "missing config":
        config, named = str(tmp_path / "nope.toml"), str(tmp_path / "nope.toml")
    elif mistake == "out is a file":
        out.write_text("notes")
        named = str(out)
    elif mistake == "empty state.json":
        (out / "checkpoints" / "resume").mkdir(parents=True)
        (out / "checkpoints" / "resume" / "state.json").write_text("")
        (out / "config.json").write_text(json.dumps({"periods": 5, "run_id": "r1"}))
        named = str(out / "checkpoints" / "resume" / "state.json")
    else:
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "config.json").write_text("{")
        extra, named = (
            ["--set", f"model.checkpoint='{tmp_path / 'ckpt'}'"],
            str(tmp_path / "ckpt" / "config.json"),
        )
    if mistake == "empty state.json":
        result = cadence("run", "--resume", str(out), check=False)
    else:
        result = cadence("run", config, "--out", str(out), *extra, check=False)
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("cadence: ") and named in line
    assert not (out / "logs").exists()  # nothing started


def test_a_killed_trainer_fails_the_run_and_stops_everything(tmp_path: Path) -> None:
    proc = start_run(tmp_path, "--set", "periods=1000000")  # never ends by itself
    try:
        pids = _wait_up(tmp_path, proc)
        victim, children = pids["trainer"], set(pids.values())
        os.kill(victim, signal.SIGKILL)
        code, out, err = proc.finish(timeout=60)
        assert code == 1 and "trainer exited" in err, (out, err)
        assert not [p for p in children if _alive(p)]  # the launcher waited for each before it exited
        assert _slots_left(tmp_path) == []  # the publisher was killed: its slots went with the workers
    finally:
        proc.kill()


def test_a_launcher_killed_outright_takes_its_actors_with_it(tmp_path: Path) -> None:
    proc = start_run(tmp_path, "--set", "periods=1000000")  # never ends by itself
    try:
        children = set(_wait_up(tmp_path, proc).values())
        proc.proc.kill()  # SIGKILL: no clean-up code runs in the launcher
        proc.proc.wait(30)
        # each actor notices its launcher is gone by itself
        wait_until(lambda: not [p for p in children if _alive(p)], 60, "every actor gone", interval_s=0.2)
        assert _slots_left(tmp_path) == []
    finally:
        proc.kill()
