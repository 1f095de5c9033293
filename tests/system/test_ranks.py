"""A trainer of 2 data-parallel ranks under torchrun, started by `cadence run`: the weights of 1 rank,
and no process left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence, events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
SAME = ["--set", "rollout.workers=1", "--set", "trainer.micro_batch_tokens=0", "--set", "seed=3", *SMALL]


def _processes_of(out: Path) -> list[int]:
    """Live processes whose command line names the run folder (launcher, torchrun, ranks, actors)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(out) in cmdline.read_bytes().decode(errors="replace"):
                status = (cmdline.parent / "status").read_text()
                if "zombie" not in status.lower():
                    found.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    return found


def test_two_ranks_end_with_the_weights_of_one(tmp_path: Path) -> None:
    """1 rank, 2 ranks, 2 sharded ranks (FSDP2): the same data and weights, with the reference model
    (kl_beta) and resume checkpoints on the way."""
    rows, weights = {}, {}
    for name, ranks, sharding in (("ranks1", 1, "none"), ("ranks2", 2, "none"), ("fsdp2", 2, "fsdp2")):
        out = tmp_path / name
        cadence(
            *("run", "configs/quickstart.toml", "--out", str(out), "--set", "periods=4"),
            *("--set", f"trainer.ranks={ranks}", "--set", f"trainer.sharding='{sharding}'", *SAME),
            *("--set", "trainer.kl_beta=0.05", "--set", "trainer.checkpoint_every=2"),
        )
        assert summary(out)["groups_trained"] == 4 * 4
        rows[name] = [r["samples_sha256"] for r in read_jsonl(out / "metrics.jsonl")]
        weights[name] = load_file(str(out / "checkpoints" / "final" / "model.safetensors"))
        assert (out / "checkpoints" / "resume" / "optimizer.pt").exists()
        steps = [e for e in events(out, "trainer") if e["event"] == "optimizer_step"]
        assert max(e["grad_norm"] for e in steps) > 0.1 and max(e["kl_sum"] for e in steps) > 0  # they moved
        assert not _processes_of(out)  # torchrun and both ranks are gone with the launcher
    assert rows["ranks1"] == rows["ranks2"] == rows["fsdp2"] and len(set(rows["ranks1"])) == 4
    for name in ("ranks2", "fsdp2"):  # the same data period by period, so the same weights
        diff = max(float((weights["ranks1"][k] - weights[name][k]).abs().max()) for k in weights["ranks1"])
        assert diff <= 1e-5, name
    follower = events(tmp_path / "ranks2", "trainer.rank1")
    assert [e["event"] for e in follower] == ["follower_ready", "follower_stopped"]
    assert follower[0]["pid"] != events(tmp_path / "ranks2", "trainer")[0]["pid"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "launcher-killed"])
def test_stopping_the_run_takes_torchrun_and_every_rank_with_it(tmp_path: Path, signum: int) -> None:
    # a lost dispatcher would end the actors only after 5 minutes of silence: well after the wait below
    run = start_run(
        tmp_path,
        "--set",
        "periods=1000000",
        "--set",
        "trainer.ranks=2",
        "--set",
        "transport.liveness=600",
        *SAME,
    )
    try:
        wait_until(lambda: read_jsonl(tmp_path / "metrics.jsonl"), 120, "first period", run.proc, 0.2)
        ranks = {int(events(tmp_path, name)[0]["pid"]) for name in ("trainer", "trainer.rank1")}
        started = set(_processes_of(tmp_path)) - {run.proc.pid}
        assert ranks < started  # torchrun besides the ranks
        os.kill(run.proc.pid, signum)
        run.proc.wait(60)
        wait_until(
            lambda: not set(_processes_of(tmp_path)) & started, 90, "every process gone", interval_s=0.2
        )
    finally:
        run.kill()
