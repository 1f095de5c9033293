"""Resume from the command line: a run killed after a checkpoint and continued ends where an
uninterrupted run of the same config ends, and a trainer killed alone rejoins the live run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from cadence.config import load_config, to_dict
from cadence.monitor.run_dir import read_jsonl, write_json
from cadence.ops.schedule import lr_at
from tests.system.helpers import ROOT, SMALL, cadence, events, start_run, summary, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

PERIODS = 8
SAME = ["--set", f"periods={PERIODS}", "--set", "rollout.workers=1", "--set", "trainer.checkpoint_every=2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    cadence("run", "configs/quickstart.toml", "--out", str(out), *SMALL, *SAME)
    return out


def checkpoint_version(out: Path) -> int:
    try:
        return int(json.loads((out / "checkpoints" / "resume" / "state.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return -1


def wait_for_checkpoint(
    out: Path, version: int, alive: subprocess.Popen[Any] | None, timeout: float = 120
) -> None:
    """Until a resume checkpoint of `version` or later is written; polled often, so that the run is
    stopped soon after it."""
    what = f"resume checkpoint of period {version} in {out}"
    wait_until(lambda: checkpoint_version(out) >= version, timeout, what, alive, interval_s=0.005)


def assert_same_end(out: Path, reference: Path, exact: bool = False) -> None:
    """The resumed run ended like `reference`: the same tokens, the same weights within float32
    rounding, or to the bit (`exact`: in prompt order, where no sum's order depends on timing)."""
    s = summary(out)
    assert s["periods"] == PERIODS and s["final_version"] == PERIODS
    assert s["groups_trained"] == summary(reference)["groups_trained"]
    assert [r["period"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(PERIODS))
    ours = [r["samples_sha256"] for r in read_jsonl(out / "metrics.jsonl")]
    assert ours == [r["samples_sha256"] for r in read_jsonl(reference / "metrics.jsonl")]
    name = "model.safetensors"
    if (reference / "checkpoints" / "final" / "adapter_model.safetensors").exists():  # [trainer.lora]
        name = "adapter_model.safetensors"
    got = load_file(str(out / "checkpoints" / "final" / name))
    want = load_file(str(reference / "checkpoints" / "final" / name))
    assert got.keys() == want.keys()
    if exact:
        assert all(torch.equal(got[k], want[k]) for k in got)
    assert max(float((got[k] - want[k]).abs().max()) for k in got) <= 1e-5


def test_a_killed_run_resumed_ends_like_the_uninterrupted_one(uninterrupted: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = start_run(out, *SAME)
    try:
        wait_for_checkpoint(out, 4, run.proc)
    finally:
        run.kill()  # SIGKILL: the launcher and every process of the run
    killed_at = checkpoint_version(out)
    assert 4 <= killed_at < PERIODS and not (out / "summary.json").exists(), "killed too late"
    done = cadence("run", "--resume", str(out))
    assert f"resumed at period {killed_at}" in done.stdout
    assert_same_end(out, uninterrupted)
    resumed = [e for e in events(out, "trainer") if e["event"] == "resumed"]
    assert [e["version"] for e in resumed] == [killed_at]


def killed_and_resumed(tmp_path: Path, settings: list[str], exact: bool = False) -> tuple[Path, Path]:
    """A run of `settings` killed after its checkpoint of period 4 or later and resumed, beside an
    uninterrupted one; both folders, once the resumed run ended like the uninterrupted one (to the
    bit with `exact`)."""
    reference = tmp_path / "uninterrupted"
    cadence("run", "configs/quickstart.toml", "--out", str(reference), *SMALL, *settings)
    out = tmp_path / "run"
    run = start_run(out, *settings)
    try:
        wait_for_checkpoint(out, 4, run.proc)
    finally:
        run.kill()
    killed_at = checkpoint_version(out)
    assert 4 <= killed_at < PERIODS and not (out / "summary.json").exists(), "killed too late"
    assert f"resumed at period {killed_at}" in cadence("run", "--resume", str(out)).stdout
    assert_same_end(out, reference, exact)
    return out, reference


def test_a_killed_oversampled_run_resumed_ends_like_the_uninterrupted_one(tmp_path: Path) -> None:
    """Over-sampled periods in prompt order, groups with equal rewards filtered out: the resumed period
    issues the same prompts (its stream is a function of the period), keeps and trains the same groups."""
    sampled = ["--set", "sampling.oversample=0.5", "--set", "sampling.filters=['zero_variance']"]
    out, reference = killed_and_resumed(
        tmp_path, [*SAME, *sampled, "--set", "sampling.order='prompt'"], exact=True
    )
    rows = read_jsonl(reference / "metrics.jsonl")
    assert all(r["prompts_issued"] >= 6 and r["groups_arrived"] >= r["groups"] for r in rows)
    assert sum(r["groups_filtered"] for r in rows) > 0  # the filter had something to do
    assert [r["groups_filtered"] for r in read_jsonl(out / "metrics.jsonl")] == [
        r["groups_filtered"] for r in rows
    ]


def test_a_killed_bf16_run_resumed_ends_like_the_uninterrupted_one(tmp_path: Path) -> None:
    """bf16 training: the resume checkpoint holds the float32 master weights and AdamW state, so the
    resumed run continues exactly as the uninterrupted one, to the bit. In prompt order: in arrival
    order which groups share a micro-batch depends on when they come, and bf16 autocast rounds a
    packed batch's sums differently, far beyond the float32 rounding the other resumes compare within."""
    killed_and_resumed(
        tmp_path, [*SAME, "--set", "trainer.precision='bf16'", "--set", "sampling.order='prompt'"], exact=True
    )


SCHEDULED = [
    *SAME,
    *("--set", "trainer.lr_schedule='cosine'", "--set", "trainer.warmup_periods=2"),
    *("--set", "trainer.min_lr_ratio=0.1", "--set", "trainer.steps_per_period=2"),
    *("--set", "rollout.temperature=0.7", "--set", "trainer.objective='grpo'"),
]


def test_a_killed_scheduled_run_resumed_ends_like_the_uninterrupted_one(tmp_path: Path) -> None:
    """Warmup and a cosine decay over two steps a period (old log-probs the engine's, at T = 0.7): the
    resumed run takes each step at the rate the uninterrupted one took it, and ends with its weights."""
    out, reference = killed_and_resumed(tmp_path, SCHEDULED)
    lr = load_config(None).trainer.lr
    want = [lr_at(2 * p + 1, lr, "cosine", 2 * PERIODS, 4, 0.1) for p in range(PERIODS)]  # each last step
    for run_dir in (out, reference):
        rows = read_jsonl(run_dir / "metrics.jsonl")
        assert [r["lr"] for r in rows] == pytest.approx(want, rel=1e-6)
        assert all(0 <= r["clip_fraction"] <= 1 for r in rows)
        # an entropy wherever a token was computed; none made up where every group had equal rewards
        assert all(r["entropy"] > 0 if r["tokens_computed"] else r["entropy"] is None for r in rows)
        assert any(r["tokens_computed"] for r in rows)


@pytest.mark.parametrize(
    ("liveness", "reason"),
    [(20, "silent"), (3000, "re-registered")],  # lost after 2 s, or 5 minutes after the new trainer came
    ids=["lost-then-back", "replaced-before-lost"],
)
def test_a_trainer_killed_alone_rejoins_the_live_run(
    uninterrupted: Path, tmp_path: Path, liveness: int, reason: str
) -> None:
    """`cadence trainer --resume` started by hand while the dispatcher and the worker go on."""
    out = tmp_path / "live"
    out.mkdir()
    overrides = [a for a in SMALL + SAME if a != "--set"]
    cfg = load_config(
        ROOT / "configs" / "quickstart.toml", [*overrides, "trainer.on_loss='wait'", "run_id='live'"]
    )
    data = to_dict(cfg) | {
        "transport": to_dict(cfg)["transport"] | {"heartbeat_s": 0.1, "liveness": liveness}
    }
    write_json(out / "config.json", data)
    base = [sys.executable, "-m", "cadence"]
    common = ["--config", str(out / "config.json"), "--out", str(out), "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen([*base, *args, *common], cwd=ROOT, env=env))
        return procs[-1]

    try:
        dispatcher = start("dispatcher")
        addr = out / "dispatcher.addr"
        wait_until(
            lambda: addr.exists() and addr.read_text().strip(), 60, "dispatcher address", dispatcher, 0.05
        )
        address = (out / "dispatcher.addr").read_text().strip()
        trainer = start("trainer", "--connect", address)
        start("rollout", "--connect", address, "--name", "rollout-0")
        wait_for_checkpoint(out, 4, trainer)
        trainer.kill()
        trainer.wait(30)
        killed_at = checkpoint_version(out)
        assert 4 <= killed_at < PERIODS, "killed too late"
        if reason == "silent":  # declared lost before the new trainer starts, however long either takes

            def declared_lost() -> bool:
                log = events(out, "dispatcher")
                return any(e["event"] == "trainer_lost_waiting" and e["role"] == "trainer" for e in log)

            wait_until(declared_lost, 60, "the killed trainer declared lost", dispatcher)
        start("trainer", "--connect", address, "--resume")
        assert dispatcher.wait(120) == 0
        for proc in procs:
            proc.wait(30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    assert_same_end(out, uninterrupted)
    log = events(out, "dispatcher")
    lost = [e for e in log if e["event"] == "trainer_lost_waiting"]
    assert sorted(e["role"] for e in lost) == ["publisher", "trainer"]
    assert next(e for e in lost if e["role"] == "trainer")["reason"] == reason
    assert any(e["event"] == "trainer_changed" for e in events(out, "rollout-0"))
