"""The `[environment]` section: its keys and ranges, the rules across keys, and what a run builds of it
(an environment that does not load stops the run before anything starts, naming the key)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from cadence.config import ConfigError, load_config
from cadence.launch.build import make_episodes, make_tokenizer
from cadence.launch.launcher import launch
from cadence.launch.settings import trainer_settings
from cadence.rollout.play import Episodes
from cadence.tasks.environments.calculator import Calculator
from cadence.tasks.environments.guess import GuessNumber

EPISODES = ["model.max_position=512", "environment.max_tokens=256"]


def config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return str(info.value)


def test_without_a_name_the_run_is_single_turn_whatever_the_other_keys() -> None:
    cfg = load_config(None, ["environment.max_tokens=100000", "rollout.engine='vllm'"])
    assert cfg.environment.name == "" and make_episodes(cfg, make_tokenizer(cfg)) is None


def test_the_keys_are_read() -> None:
    cfg = load_config(
        None,
        [
            *EPISODES,
            "environment.name='guess_number'",
            "environment.max_turns=5",
            "environment.max_turn_tokens=32",
            "environment.step_timeout_s=2.5",
            "environment.episode_timeout_s=60",
            "environment.on_error=-1",
            "environment.role='tool'",
        ],
    )
    e = cfg.environment
    assert (e.name, e.max_turns, e.max_tokens, e.max_turn_tokens) == ("guess_number", 5, 256, 32)
    assert (e.step_timeout_s, e.episode_timeout_s, e.on_error, e.role) == (2.5, 60.0, -1.0, "tool")


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ("environment.max_turns=0", "environment.max_turns must be >= 1, got 0"),
        ("environment.max_tokens=0", "environment.max_tokens must be >= 1, got 0"),
        ("environment.max_turn_tokens=0", "environment.max_turn_tokens must be >= 1, got 0"),
        ("environment.step_timeout_s=0", "environment.step_timeout_s must be finite and positive, got 0"),
        ("environment.episode_timeout_s=inf", "environment.episode_timeout_s must be finite and positive"),
        ("environment.on_error=nan", "environment.on_error must be finite, got nan"),
        ("environment.role='system'", "environment.role"),
    ],
)
def test_a_value_out_of_range_names_its_key(override: str, refusal: str) -> None:
    assert refusal in config_error(override)


def test_episodes_run_on_the_built_in_engine_and_on_vllm() -> None:
    for engine in ("torch", "vllm"):
        cfg = load_config(None, [*EPISODES, "environment.name='calculator'", f"rollout.engine='{engine}'"])
        assert cfg.environment.name == "calculator" and cfg.rollout.engine == engine
    refusal = config_error(*EPISODES, "environment.name='calculator'", "rollout.engine='simulated'")
    assert "needs rollout.engine = 'torch' or 'vllm' (got 'simulated')" in refusal
    assert "the simulated engine plays no episodes" in refusal


def test_an_episode_fits_vllms_planned_positions() -> None:
    vllm = [*EPISODES, "environment.name='calculator'", "rollout.engine='vllm'"]
    refusal = config_error(*vllm, "vllm.max_model_len=256")
    assert "environment.max_tokens = 256 leaves the first message no room in vllm.max_model_len = 256" in (
        refusal
    )
    assert load_config(None, [*vllm, "vllm.max_model_len=257"]).vllm.max_model_len == 257
    assert load_config(None, vllm).vllm.max_model_len == 0  # the model's positions, checked above
    # the built-in engine plans no vLLM positions: the key is not its limit
    assert load_config(None, [*EPISODES, "environment.name='calculator'", "vllm.max_model_len=256"])


def test_an_episode_fits_the_models_positions() -> None:
    refusal = config_error(
        "environment.name='calculator'", "model.max_position=256", "environment.max_tokens=256"
    )
    assert (
        "environment.max_tokens = 256 leaves the first message no room in model.max_position = 256" in refusal
    )
    refusal = config_error(*EPISODES, "environment.name='calculator'", "environment.max_turn_tokens=300")
    assert "environment.max_turn_tokens = 300 must be at most environment.max_tokens = 256" in refusal
    # a checkpoint's positions are its own: checked when the run builds its workers
    load_config(
        None, ["environment.name='calculator'", "model.checkpoint='/nowhere'", "environment.max_tokens=900"]
    )


def test_an_episode_is_scored_by_its_environment_alone() -> None:
    refusal = config_error(*EPISODES, "environment.name='calculator'", "rewards.weights={math = 1.0}")
    assert "rewards.weights = {'math': 1.0} with environment.name = 'calculator'" in refusal


def test_a_name_loads_a_built_in_environment_or_a_factory() -> None:
    for name, factory in (("calculator", Calculator), ("guess_number", GuessNumber)):
        cfg = load_config(None, [*EPISODES, f"environment.name='{name}'", "environment.role='tool'"])
        episodes = make_episodes(cfg, make_tokenizer(cfg))
        assert isinstance(episodes, Episodes) and episodes.factory is factory and episodes.name == name
        assert episodes.bounds.max_tokens == 256 and episodes.bounds.max_turns == 8
    cfg = load_config(None, [*EPISODES, "environment.name='tests.actors.test_rollout_episodes:Again'"])
    episodes = make_episodes(cfg, make_tokenizer(cfg))
    assert isinstance(episodes, Episodes) and episodes.factory.__name__ == "Again"


@pytest.mark.parametrize(
    "name", ["chess", "no_such_module:make", "cadence.tasks.environments.calculator:Nope"]
)
def test_a_name_that_does_not_load_stops_the_run_before_anything_starts(name: str, tmp_path: Path) -> None:
    cfg = load_config(None, [*EPISODES, f"environment.name='{name}'"])
    with pytest.raises(ConfigError, match="environment.name"):
        make_episodes(cfg, make_tokenizer(cfg))
    with pytest.raises(ConfigError, match="environment.name"):
        launch(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # nothing written, nothing started


def test_the_character_tokenizer_takes_the_environments_text_after_the_tasks() -> None:
    single = make_tokenizer(load_config(None, []))
    cfg = load_config(None, [*EPISODES, "environment.name='calculator'"])
    tokenizer = make_tokenizer(cfg)
    assert isinstance(single.alphabet, str) and tokenizer.alphabet.startswith(single.alphabet)  # type: ignore[attr-defined]
    assert set(string.ascii_letters + "<>/()*\n") <= set(tokenizer.alphabet)  # type: ignore[attr-defined]
    assert (
        trainer_settings(cfg, tokenizer.vocab_size).steps.max_sampled_tokens == 256
    )  # dr_grpo's constant: the budget


def test_an_agent_is_loaded_with_the_bounds_and_refused_beside_a_name(tmp_path: Path) -> None:
    from cadence.rollout.agent.episodes import AgentEpisodes
    from cadence.rollout.agent.sampling import Sampling
    from tests.system.tiny_agent import agent

    cfg = load_config(
        None,
        [
            *EPISODES,
            "environment.agent='tests.system.tiny_agent:agent'",
            "environment.max_choices=2",
            "rollout.temperature=0.7",
            "rollout.top_p=0.9",
            "environment.agent_sampling='refuse'",
            "environment.agent_listen='unix'",
        ],
    )
    episodes = make_episodes(cfg, make_tokenizer(cfg))
    assert isinstance(episodes, AgentEpisodes) and episodes.agent is agent and episodes.max_choices == 2
    assert episodes.sampling == Sampling(0.7, 0.9, "refuse") and episodes.listen == "unix"
    assert episodes.bounds.max_tokens == 256 and episodes.model == "cadence"
    assert trainer_settings(cfg, 100).steps.max_sampled_tokens == 256
    both = config_error(*EPISODES, "environment.name='calculator'", "environment.agent='a.b:c'")
    assert "environment.agent" in both and "set one" in both
    cfg = load_config(None, [*EPISODES, "environment.agent='no_such_module:agent'"])
    with pytest.raises(ConfigError, match="environment.agent"):
        launch(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
