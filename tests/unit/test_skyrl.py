"""SkyRL-gym environments run unchanged: the package's own gsm8k environments, by registry id and by
class, on data made here; per-step rewards are `Reply.reward`, `done` the episode's end."""

from __future__ import annotations

import pytest

pytest.importorskip("skyrl_gym", reason="SkyRL-gym is an optional extra: pip install 'cadence[skyrl]'")

from cadence.config import ConfigError  # noqa: E402
from cadence.tasks.base import Prompt  # noqa: E402
from cadence.tasks.environments.bounds import Bounds  # noqa: E402
from cadence.tasks.environments.loading import load_environment  # noqa: E402
from cadence.tasks.environments.runner import EpisodeRunner  # noqa: E402
from tests.unit.test_episode_runner import CODEC, Scripted  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SUM = Prompt(3, "What is 3 + 4? End with #### and the number.", "7")


async def test_a_multi_turn_skyrl_environment_by_registry_id() -> None:
    factory = load_environment("skyrl:gsm8k_multi_turn", kwargs={"max_turns": 3})
    model = Scripted({1: ["I think 8.", "#### 8", "#### 7"], 2: ["#### 7"]})
    right_later, right_first = await EpisodeRunner(factory, model, CODEC, Bounds()).run([(SUM, 1), (SUM, 2)])
    assert (right_later.ended, right_later.model_turns, right_first.model_turns) == ("done", 3, 1)
    # its own per-turn rewards: nothing, the format's share (0.2 / 3 turns), then right
    assert right_later.turn_rewards == [0.0, pytest.approx(0.2 / 3), 1.0]
    assert right_later.turns[2].text.startswith("Please provide your step-by-step reasoning")
    assert right_later.turns[4].text.startswith("Now provide only the final numeric answer")
    assert (right_later.score.reward, right_later.score.correct) == (1.0, 1.0)
    assert (right_first.score.reward, right_first.ended) == (1.0, "done")


async def test_a_skyrl_environment_by_class_ends_after_one_step() -> None:
    factory = load_environment("skyrl:skyrl_gym.envs.gsm8k.env:GSM8kEnv")
    model = Scripted({1: ["#### 6"]})
    (result,) = await EpisodeRunner(factory, model, CODEC, Bounds()).run([(SUM, 1)])
    assert (result.ended, result.model_turns, result.score.reward, result.score.correct) == (
        "done",
        1,
        0.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("skyrl:no_such_env", "no SkyRL-gym environment 'no_such_env'; registered: aime, gsm8k"),
        ("skyrl:skyrl_gym.envs.gsm8k.env:Missing", "cannot load 'skyrl_gym.envs.gsm8k.env:Missing'"),
    ],
)
def test_a_skyrl_name_that_does_not_load_names_the_key(name: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"environment.name = '{name}': {said}"):
        load_environment(name)
