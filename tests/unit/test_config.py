"""Run configuration: shipped configs parse, bad keys and values are named, overrides apply."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

import cadence.config.environment as config_environment
import cadence.config.run as config_module
import cadence.config.sections as config_sections
import cadence.config.trainer as config_trainer
from cadence.config import ConfigError, RunConfig, load_config, to_dict

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def config_error(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def config_dataclasses() -> list[type]:
    """Every dataclass defined in the config modules (the run and its sections)."""
    modules = (
        config_module.__name__,
        config_sections.__name__,
        config_trainer.__name__,
        config_environment.__name__,
    )
    return [
        obj
        for obj in vars(config_module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ in modules
    ]


def test_configs_exist() -> None:
    assert CONFIGS, "no configs/*.toml found"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_parses(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    assert cfg != RunConfig() or path.read_text().strip() == ""


def test_quickstart_values_are_read() -> None:
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml")
    assert cfg.periods == 600
    assert cfg.mode == "periodic"
    assert cfg.rollout.group_size == 16
    assert cfg.task.rule == "max"
    assert cfg.trainer.clip_high == 0.28
    assert isinstance(cfg.trainer.lr, float)


def test_defaults_without_a_file() -> None:
    assert load_config(None) == RunConfig()


def test_unknown_nested_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[rollout]\nwrokers = 3\n")
    message = config_error([], path)
    assert "'rollout.wrokers'" in message
    assert "workers" in message  # the allowed keys are listed


def test_unknown_top_level_key_and_section_are_named() -> None:
    assert "'sed'" in config_error(["sed=1"])
    assert "'trainr'" in config_error(["trainr.lr=0.1"])


def test_bad_literal_names_the_key_and_the_allowed_values() -> None:
    message = config_error(["mode=turbo"])
    assert "mode = 'turbo'" in message
    assert "'periodic'" in message and "'sync'" in message
    message = config_error(["task.rule=product"])
    assert "task.rule" in message and "'sum', 'copy', 'max'" in message


@pytest.mark.parametrize(
    ("override", "key", "kind"),
    [
        ("seed='seven'", "seed", "int"),
        ("seed=1.5", "seed", "int"),
        ("seed=true", "seed", "int"),
        ("rollout.workers=[1]", "rollout.workers", "int"),
        ("trainer.lr='fast'", "trainer.lr", "float"),
        ("trainer.lr=true", "trainer.lr", "float"),
        ("transport.host=5", "transport.host", "str"),
    ],
)
def test_wrong_type_names_the_key(override: str, key: str, kind: str) -> None:
    assert f"{key} must be {kind}" in config_error([override])


def test_a_section_that_is_not_a_table_is_refused() -> None:
    assert "rollout must be a table" in config_error(["rollout=3"])
    assert "rollout" in config_error(["rollout=3", "rollout.workers=2"])


def test_int_is_accepted_for_a_float() -> None:
    cfg = load_config(None, ["trainer.lr=1"])
    assert cfg.trainer.lr == 1.0 and isinstance(cfg.trainer.lr, float)


def test_overrides_apply_over_the_file() -> None:
    cfg = load_config(CONFIGS[0], ["mode=sync", "rollout.workers=3", "seed=7", "periods=2"])
    assert cfg.mode == "sync"  # unquoted: not TOML, falls back to the string
    assert cfg.rollout.workers == 3
    assert cfg.seed == 7
    assert cfg.periods == 2
    untouched = load_config(CONFIGS[0])
    assert cfg.rollout.group_size == untouched.rollout.group_size
    assert cfg.trainer == untouched.trainer


def test_override_values_are_parsed_as_toml() -> None:
    cfg = load_config(
        None, ["trainer.lr=2e-4", "run_id='r 1'", "transport.host = 0.0.0.0", "rollout.workers=5"]
    )
    assert cfg.trainer.lr == 2e-4
    assert cfg.run_id == "r 1"
    assert cfg.transport.host == "0.0.0.0"
    assert cfg.rollout.workers == 5


def test_the_last_override_wins() -> None:
    assert load_config(None, ["seed=1", "seed=2"]).seed == 2


def test_values_a_command_fixes_win_and_are_checked_with_the_rest() -> None:
    fsdp2 = ["trainer.sharding='fsdp2'", "trainer.packing='shared_prompt'", "trainer.ranks=1"]
    with pytest.raises(ConfigError, match=r"trainer.sharding = 'fsdp2' needs trainer.ranks > 1"):
        load_config(None, fsdp2)
    assert load_config(None, fsdp2, {"trainer.ranks": 2}).trainer.ranks == 2  # one check, after all
    with pytest.raises(ConfigError, match="trainer.ranks"):
        load_config(None, [], {"trainer.ranks": 0})


def test_the_liveness_timeout_is_the_heartbeat_times_the_liveness() -> None:
    assert (
        load_config(None, ["transport.heartbeat_s=0.25", "transport.liveness=8"]).transport.liveness_timeout_s
        == 2.0
    )


@pytest.mark.parametrize("item", ["seed", "=3", "  =x"])
def test_malformed_override_is_refused(item: str) -> None:
    assert "is not key=value" in config_error([item])


@pytest.mark.parametrize(
    "key",
    [
        "periods",
        "task.prompts_per_period",
        "rollout.group_size",
        "rollout.max_new_tokens",
        "rollout.inflight",
        "weights.chunk_bytes",
        "weights.keep_versions",
        "transport.heartbeat_s",
        "transport.liveness",
    ],
)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_non_positive_values_are_refused(key: str, value: str) -> None:
    message = config_error([f"{key}={value}"])
    assert key in message and "positive" in message


def test_a_weight_chunk_larger_than_a_frame_is_refused() -> None:
    message = config_error(["weights.chunk_bytes=2048", "transport.max_frame_bytes=1024"])
    assert "weights.chunk_bytes (2048) must be at most transport.max_frame_bytes (1024)" in message


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_a_run_without_workers_is_refused(workers: str) -> None:
    assert f"rollout.workers must be >= 1, got {workers}" in config_error([f"rollout.workers={workers}"])


def test_a_group_of_one_is_refused() -> None:
    message = config_error(["rollout.group_size=1"])
    assert "rollout.group_size must be >= 2, got 1" in message
    assert load_config(None, ["rollout.group_size=2"]).rollout.group_size == 2


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "0", "-1e-3"])
def test_the_learning_rate_must_be_finite_and_positive(lr: str) -> None:
    assert "trainer.lr must be finite and positive" in config_error([f"trainer.lr={lr}"])


@pytest.mark.parametrize(
    ("item", "key"),
    [
        ("rollout.wait_for_workers_s=0", "rollout.wait_for_workers_s"),
        ("rewards.timeout_s=0", "rewards.timeout_s"),
        ("rewards.timeout_s=inf", "rewards.timeout_s"),
        ("rewards.on_error=nan", "rewards.on_error"),
    ],
)
def test_worker_wait_and_reward_deadline_are_checked(item: str, key: str) -> None:
    assert key in config_error([item])


def test_bad_top_p_is_refused() -> None:
    assert "rollout.top_p" in config_error(["rollout.top_p=0"])
    assert "rollout.top_p" in config_error(["rollout.top_p=1.5"])


@pytest.mark.parametrize("key", ["transport.max_frame_bytes", "task.digits"])
def test_other_sizes_must_be_positive(key: str) -> None:
    assert key in config_error([f"{key}=0"])


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_the_format_weight_is_a_share(value: str) -> None:
    assert f"task.format_weight must be in [0, 1], got {value}" in config_error(
        [f"task.format_weight={value}"]
    )


def test_an_arithmetic_operand_range_is_refused_below_one() -> None:
    assert "task.max_operand must be >= 1, got 0" in config_error(["task.max_operand=0"])


def test_bad_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("mode = \n")
    assert "broken.toml" in config_error([], path)


def test_json_config_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text('{"seed": 3, "rollout": {"workers": 1}}')
    cfg = load_config(path)
    assert (cfg.seed, cfg.rollout.workers) == (3, 1)


def test_to_dict_round_trips_through_overrides_free_loading(tmp_path: Path) -> None:
    cfg = load_config(None, ["mode=sync", "seed=5", "task.rule='max'"])
    path = tmp_path / "resolved.json"
    path.write_text(json.dumps(to_dict(cfg)))
    assert load_config(path) == cfg


def test_every_leaf_field_has_a_doc() -> None:
    classes = config_dataclasses()
    assert RunConfig in classes and len(classes) >= 8
    missing = []
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                continue  # sections: see the next test
            if not str(f.metadata.get("doc", "")).strip():
                missing.append(f"{cls.__name__}.{f.name}")
    assert missing == []


def test_every_field_including_sections_has_a_doc() -> None:
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in config_dataclasses()
        for f in dataclasses.fields(cls)
        if not str(f.metadata.get("doc", "")).strip()
    ]
    assert missing == []


def test_waiting_for_a_lost_trainer_needs_resume_checkpoints() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.on_loss = 'wait' needs trainer\.checkpoint_every > 0"):
        load_config(None, ["trainer.on_loss='wait'"])
    cfg = load_config(None, ["trainer.on_loss='wait'", "trainer.checkpoint_every=2"])
    assert (cfg.trainer.on_loss, cfg.trainer.checkpoint_every) == ("wait", 2)
    assert load_config(None, ["trainer.checkpoint_every=2"]).trainer.on_loss == "fail"  # the default
    with pytest.raises(ConfigError, match="trainer.on_loss"):
        load_config(None, ["trainer.on_loss='retry'"])


def test_the_rollout_correction_is_read_and_checked() -> None:
    cfg = load_config(
        None, ["trainer.rollout_correction.mode=truncate", "trainer.rollout_correction.level=geometric"]
    )
    assert (cfg.trainer.rollout_correction.mode, cfg.trainer.rollout_correction.level) == (
        "truncate",
        "geometric",
    )
    assert load_config(None, []).trainer.rollout_correction.mode == "off"  # off by default
    assert "trainer.rollout_correction.mode" in config_error(["trainer.rollout_correction.mode=clip"])
    assert "trainer.rollout_correction.cap" in config_error(["trainer.rollout_correction.cap=0.5"])
    assert "trainer.rollout_correction.low" in config_error(["trainer.rollout_correction.low=1.5"])
    assert "trainer.rollout_correction.high" in config_error(["trainer.rollout_correction.high=0.9"])
    assert "trainer.mismatch.bound" in config_error(["trainer.mismatch.bound=1"])
    vllm_at_t1 = ["rollout.engine=vllm", "rollout.top_p=0.9", "rollout.temperature=0.7"]
    load_config(None, vllm_at_t1)  # measured nothing, corrected nothing: allowed
    message = config_error([*vllm_at_t1, "trainer.rollout_correction.mode=mask"])
    assert "trainer.rollout_correction.mode" in message and "temperature 1" in message
