"""Resume checkpoints: the learner's state round trip, the atomic swap, the config check, metrics."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from cadence.config import ConfigError, SimulatedConfig
from cadence.monitor.period_metrics import PeriodMetrics
from cadence.monitor.run_dir import RunRecorder, read_jsonl, truncate_metrics
from cadence.training.learner import TorchLearner
from cadence.training.resume import (
    ResumeError,
    RunRecord,
    ask_for_checkpoint,
    check_config,
    checkpoint_asked,
    clear_checkpoint_ask,
    find_resume,
    load_resume,
    save_resume,
)
from cadence.training.simulated import SimulatedLearner
from tests.conftest import tiny_config
from tests.unit.test_learner import learner, micro_batch


def trained(steps: int) -> TorchLearner:
    model = learner("shared_prompt", kl_beta=0.1)
    for _ in range(steps):
        model.train_groups(micro_batch())
        model.step(10.0)
    return model


def optimizer_tensors(model: TorchLearner) -> list[torch.Tensor]:
    state = model.optimizer.state_dict()["state"]
    return [t for i in sorted(state) for t in (state[i]["step"], state[i]["exp_avg"], state[i]["exp_avg_sq"])]


def test_learner_state_round_trip_weights_moments_and_rng(tmp_path: Path) -> None:
    saver = trained(2)
    random.seed(11)
    torch.manual_seed(11)
    saver.save_state(tmp_path)
    draws = (random.random(), torch.rand(3))
    loader = learner("shared_prompt", kl_beta=0.1)  # the initial weights, as a restarted trainer has
    pairs = zip(saver.model.parameters(), loader.model.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)
    loader.load_state(tmp_path)
    assert (random.random(), *torch.rand(3).tolist()) == (draws[0], *draws[1].tolist())
    for a, b in zip(saver.model.parameters(), loader.model.parameters(), strict=True):
        assert torch.equal(a, b)
    moments = optimizer_tensors(saver)
    assert moments and all(torch.equal(a, b) for a, b in zip(moments, optimizer_tensors(loader), strict=True))
    assert float(moments[0]) == 2.0  # AdamW's step count came along
    # the next step is the one the saver takes: same weights afterwards, bit for bit
    for model in (saver, loader):
        model.train_groups(micro_batch())
        model.step(10.0)
    for a, b in zip(saver.model.parameters(), loader.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # and the frozen reference is still the initial model, not the resumed policy
    assert loader.reference is not None
    fresh = learner("shared_prompt", kl_beta=0.1)
    for a, b in zip(loader.reference.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_simulated_learner_state_round_trip(tmp_path: Path) -> None:
    saver = SimulatedLearner(SimulatedConfig(step_s=0.0, weights_bytes=64))
    for _ in range(3):
        saver.step(1.0)
    saver.save_state(tmp_path)
    loader = SimulatedLearner(SimulatedConfig(step_s=0.0, weights_bytes=64))
    loader.load_state(tmp_path)
    assert loader.steps == 3 and loader.weights() == saver.weights()


class Failing(SimulatedLearner):
    """Dies halfway through writing its state, as a killed trainer would."""

    def save_state(self, directory: Path) -> None:
        (directory / "simulated.json").write_text('{"ste')
        raise KeyboardInterrupt


def test_checkpoints_replace_each_other_whole_and_leftovers_are_ignored(tmp_path: Path) -> None:
    cfg = tiny_config("periods=8", "trainer.checkpoint_every=2")
    model = SimulatedLearner(SimulatedConfig(step_s=0.0, weights_bytes=64))
    assert find_resume(tmp_path) is None
    save_resume(tmp_path, model, 2, RunRecord.of(cfg))
    model.step(1.0)
    path = save_resume(tmp_path, model, 4, RunRecord.of(cfg), {"period": 3})
    assert path == tmp_path / "resume" and sorted(p.name for p in tmp_path.iterdir()) == ["resume"]
    found = find_resume(tmp_path)
    assert found is not None and found[1]["version"] == 4 and found[1]["metrics"] == {"period": 3}
    # a kill while writing the next one: the half-written folder is never read, the old one stays
    with pytest.raises(KeyboardInterrupt):
        save_resume(tmp_path, Failing(model.cfg), 6, RunRecord.of(cfg))
    assert (tmp_path / "resume.tmp").is_dir()
    again = SimulatedLearner(model.cfg)
    assert load_resume(tmp_path, again, RunRecord.of(cfg))["version"] == 4 and again.steps == 1
    # a kill between the two renames: only resume.old is left, and it is taken
    os.replace(tmp_path / "resume", tmp_path / "resume.old")
    found = find_resume(tmp_path)
    assert found is not None and found[0] == tmp_path / "resume.old" and found[1]["version"] == 4
    # the next save clears every leftover
    save_resume(tmp_path, model, 6, RunRecord.of(cfg))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resume"]
    assert json.loads((tmp_path / "resume" / "state.json").read_text())["version"] == 6


def test_a_checkpoint_of_another_configuration_is_refused_naming_the_keys(tmp_path: Path) -> None:
    cfg = tiny_config("periods=8", "trainer.checkpoint_every=2")
    save_resume(tmp_path, SimulatedLearner(cfg.simulated), 4, RunRecord.of(cfg))
    state = json.loads((tmp_path / "resume" / "state.json").read_text())
    # how long the run lasts, how it is carried out: free to change
    check_config(state, RunRecord.of(tiny_config("periods=20", "rollout.workers=3", "mode='sync'")), tmp_path)
    with pytest.raises(ResumeError, match=r"trainer\.lr = 0\.002 here, 0\.001 in the checkpoint") as err:
        check_config(state, RunRecord.of(tiny_config("periods=8", "trainer.lr=0.002", "seed=5")), tmp_path)
    assert "seed = 5 here, 0 in the checkpoint" in str(err.value)
    with pytest.raises(ResumeError, match=r"model\.hidden_size = 48 here, 32 in the checkpoint"):
        check_config(state, RunRecord.of(tiny_config("periods=8", "model.hidden_size=48")), tmp_path)
    with pytest.raises(ResumeError, match="at period 4, beyond periods = 3"):
        check_config(state, RunRecord.of(tiny_config("periods=3")), tmp_path)
    with pytest.raises(ResumeError, match="no resume checkpoint"):
        load_resume(tmp_path / "elsewhere", SimulatedLearner(cfg.simulated), RunRecord.of(cfg))


def test_checkpoint_every_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="trainer.checkpoint_every must be >= 0, got -1"):
        tiny_config("trainer.checkpoint_every=-1")


def row(period: int, reward_mean: float = 0.5) -> PeriodMetrics:
    return PeriodMetrics(
        period=period, version=period, groups=4, samples=16, tokens_generated=8, reward_mean=reward_mean
    )


def test_metrics_are_continued_and_a_period_never_appears_twice(tmp_path: Path) -> None:
    first = RunRecorder(tmp_path, "periodic")
    for period in range(5):
        first.period(row(period))
    assert truncate_metrics(tmp_path / "metrics.jsonl", 4) == 1
    assert truncate_metrics(tmp_path / "metrics.jsonl", 4) == 0
    resumed = RunRecorder(tmp_path, "periodic", resume=True)
    assert [r.period for r in resumed.rows] == [0, 1, 2, 3]
    assert resumed.rewind(3) == 1 and resumed.rewind(3) == 0
    resumed.period(row(3, reward_mean=1.0))
    resumed.period(row(4))
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["period"] for r in lines] == [0, 1, 2, 3, 4] and lines[3]["reward_mean"] == 1.0
    assert [r.period for r in resumed.rows] == [0, 1, 2, 3, 4]


def test_a_checkpoint_asked_for_is_asked_until_its_ask_is_cleared(tmp_path: Path) -> None:
    assert not checkpoint_asked(tmp_path)
    ask_for_checkpoint(tmp_path)
    assert checkpoint_asked(tmp_path) and (tmp_path / "asked").is_file()  # the file `cadence slurm` writes
    clear_checkpoint_ask(tmp_path)
    assert not checkpoint_asked(tmp_path)
    clear_checkpoint_ask(tmp_path)  # no ask: nothing to clear
