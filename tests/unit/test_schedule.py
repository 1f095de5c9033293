"""Learning-rate schedules (ops/schedule.py) and the config keys of the objective and the schedule."""

from __future__ import annotations

import math

import pytest

from cadence.config import ConfigError, load_config
from cadence.ops.schedule import lr_at
from cadence.training.resume import must_match


def test_warmup_rises_linearly_then_constant_holds() -> None:
    rates = [lr_at(s, 0.1, "constant", 10, 4) for s in range(10)]
    assert rates == pytest.approx([0.025, 0.05, 0.075, 0.1] + [0.1] * 6)
    assert [lr_at(s, 0.1, "constant", 10) for s in range(10)] == [0.1] * 10  # no warmup: lr itself


@pytest.mark.parametrize("min_ratio", [0.0, 0.2])
def test_linear_and_cosine_decay_from_lr_towards_the_end_value(min_ratio: float) -> None:
    total, warmup, lr = 12, 2, 0.5
    end = lr * min_ratio
    for step in range(warmup, total):
        p = (step - warmup) / (total - warmup)
        linear = lr_at(step, lr, "linear", total, warmup, min_ratio)
        cosine = lr_at(step, lr, "cosine", total, warmup, min_ratio)
        assert linear == pytest.approx(end + (lr - end) * (1 - p))
        assert cosine == pytest.approx(end + (lr - end) * 0.5 * (1 + math.cos(math.pi * p)))
    assert lr_at(warmup, lr, "cosine", total, warmup, min_ratio) == lr
    last = lr_at(total - 1, lr, "linear", total, warmup, min_ratio)
    assert end < last < lr  # one step short of the end value
    assert lr_at(total + 5, lr, "linear", total, warmup, min_ratio) == pytest.approx(end)  # never below


def test_an_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="trainer.lr_schedule"):
        lr_at(0, 0.1, "step", 10)


def test_the_objective_and_schedule_keys_load_and_bad_values_name_the_key() -> None:
    cfg = load_config(
        None,
        [
            "trainer.objective='gspo'",
            "trainer.gspo.clip_low=0.001",
            "trainer.lr_schedule='cosine'",
            "trainer.warmup_periods=3",
            "trainer.min_lr_ratio=0.1",
        ],
    )
    assert (cfg.trainer.objective, cfg.trainer.gspo.clip_low, cfg.trainer.gspo.clip_high) == (
        "gspo",
        0.001,
        4e-4,
    )
    assert (cfg.trainer.lr_schedule, cfg.trainer.warmup_periods, cfg.trainer.min_lr_ratio) == (
        "cosine",
        3,
        0.1,
    )
    assert load_config(None).trainer.objective == "dapo"  # today's loss, the default
    bad = {
        "trainer.objective='ppo'": "trainer.objective",
        "trainer.lr_schedule='step'": "trainer.lr_schedule",
        "trainer.warmup_periods=-1": "trainer.warmup_periods",
        "trainer.warmup_periods=41": "trainer.warmup_periods",
        "trainer.min_lr_ratio=1.5": "trainer.min_lr_ratio",
        "trainer.gspo.clip_low=1.0": "trainer.gspo.clip_low",
        "trainer.clip_high=-0.1": "trainer.clip_high",
        "trainer.gspo.clip=0.1": "trainer.gspo.clip",
    }
    for override, key in bad.items():
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [override])


def test_the_samples_normaliser_is_for_dapo_alone() -> None:
    load_config(None, ["trainer.normaliser='samples'"])
    with pytest.raises(ConfigError, match=r"trainer\.normaliser = 'samples' applies to trainer\.objective"):
        load_config(None, ["trainer.normaliser='samples'", "trainer.objective='grpo'"])


def test_vllm_at_a_temperature_with_a_nucleus_cannot_give_the_old_log_probs() -> None:
    """vLLM's sampling log-probs are tempered only without a nucleus (processed ones are renormalised
    over it, so the raw ones at temperature 1 are asked for): refused where steps_per_period > 1
    reads them."""
    tempered = ["rollout.engine='vllm'", "rollout.temperature=0.7", "rollout.top_p=0.9"]
    load_config(None, tempered)  # one step a period: the engine's log-probs are not read
    load_config(None, ["rollout.engine='vllm'", "rollout.top_p=0.9", "trainer.steps_per_period=2"])  # T = 1
    load_config(None, [*tempered[:2], "trainer.steps_per_period=2"])  # no nucleus: tempered log-probs
    with pytest.raises(
        ConfigError, match=r"steps_per_period = 2 .*top_p = 0\.9 .* rollout\.temperature = 0\.7"
    ):
        load_config(None, [*tempered, "trainer.steps_per_period=2"])


def test_a_decaying_schedule_ties_the_resumed_run_to_its_length() -> None:
    constant = must_match(load_config(None, ["trainer.warmup_periods=2"]))
    decaying = must_match(load_config(None, ["trainer.lr_schedule='linear'"]))
    assert "periods" not in constant and decaying["periods"] == 40
