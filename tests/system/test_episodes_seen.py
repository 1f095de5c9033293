"""A run of multi-turn episodes as its user sees it, from the command line: the timeline shows the
workers' environment waits inside their generation, the plot draws the episode figures, `cadence eval`
plays the final checkpoint's episodes and agrees with the run's last eval round (its episode figures
in `eval.jsonl` included), and `cadence bench e2e` puts the environment's time beside generation and
training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.monitor.run_dir import read_jsonl
from tests.system.helpers import SMALL, cadence, events
from tests.system.slow_env import STEP_S

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

EPISODES = [
    "rollout.workers=1",
    "environment.name='guess_number'",
    "model.max_position=256",
    "environment.max_turns=3",
    "environment.max_tokens=48",
    "environment.max_turn_tokens=8",
]
EPISODE_KEYS = ("eval_turn", "eval_tool", "eval_env", "eval_ended_")
"""What the episode figures of an eval row (and of `cadence eval`) begin with."""
EVAL = ["eval.every=2", "eval.prompts=4", "eval.greedy=false", "eval.k=2", "eval.temperature=1.0"]


def _sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_an_episode_runs_timeline_plot_and_eval_show_its_episodes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cadence(
        "run", "configs/quickstart.toml", "--out", str(out), *_sets("periods=2", *EPISODES, *EVAL), *SMALL
    )

    spans = [e for e in events(out, "rollout-0") if e["event"] == "span"]
    waits = [s for s in spans if s["kind"] == "environment"]
    generates = [s for s in spans if s["kind"] == "generate"]
    assert {w["period"] for w in waits if not w["eval"]} == {0, 1} and any(w["eval"] for w in waits)
    for wait in waits:  # each inside the generation of its batch
        assert wait["calls"] >= 1
        assert any(
            g["period"] == wait["period"] and g["start"] <= wait["start"] <= wait["end"] <= g["end"]
            for g in generates
        ), wait

    timeline = tmp_path / "timeline.svg"
    cadence("timeline", str(out), "-o", str(timeline))
    assert ">environment<" in timeline.read_text()
    plot = tmp_path / "plot.svg"
    cadence("plot", str(out), "-o", str(plot))
    for label in ("model turns", "tool calls", "seconds in environment calls", "environment tokens"):
        assert label in plot.read_text(), label

    last = read_jsonl(out / "eval.jsonl")[-1]
    got = json.loads(
        cadence("eval", str(out / "checkpoints" / "final"), "--config", str(out / "config.json")).stdout
    )
    for key in ("eval_reward", "eval_accuracy", "eval_pass_at_k", "eval_prompts", "eval_samples"):
        assert got[key] == last[key], key
    assert (got["version"], got["eval_samples"]) == (2, 8)
    assert 1.0 <= got["eval_turns_mean"] <= 3.0 and got["eval_env_tokens"] > 0
    endings = {key: value for key, value in got.items() if key.startswith("eval_ended_")}
    assert sum(endings.values()) == 8 and set(endings) <= {
        f"eval_ended_{e}" for e in ("done", "max_turns", "token_budget")
    }
    # the run's eval round played the same episodes: the same turns as its samples show
    samples = read_jsonl(out / "samples" / "eval-period-2.jsonl")
    turns = [sum(m["author"] == "model" for m in r["messages"]) for s in samples for r in s["responses"]]
    assert sum(turns) / len(turns) == got["eval_turns_mean"]
    # and its eval.jsonl row carries the episode figures under `cadence eval`'s keys, with its values
    # (the seconds in environment calls aside: wall-clock times)
    shown = {k for k in got if k.startswith(EPISODE_KEYS)}
    assert {"eval_turns_mean", "eval_tool_calls", "eval_tool_errors", "eval_env_timeouts"} <= shown
    assert {"eval_env_s", "eval_env_tokens"} <= shown and endings.keys() <= shown
    assert {k for k in last if k.startswith(EPISODE_KEYS)} == shown
    clocked = {"eval_env_s", "eval_env_wall_s"}
    assert {k: last[k] for k in shown - clocked} == {k: got[k] for k in shown - clocked}
    assert all(row["eval_turns_mean"] >= 1.0 for row in read_jsonl(out / "eval.jsonl"))


def test_bench_e2e_of_an_episode_config_puts_the_environment_beside_generation_and_training() -> None:
    slow = [*EPISODES, "environment.name='tests.system.slow_env:Slow'"]  # every step waits STEP_S
    args = ["--json", "--config", "configs/quickstart.toml", "--periods", "3", *_sets(*slow), *SMALL]
    figures = json.loads(cadence("bench", "e2e", *args, timeout=280).stdout.strip().splitlines()[-1])
    for mode in (figures, figures["sync"]):
        assert mode["turns_mean"] == 3.0 and mode["env_s"] > 0.0  # each episode to max_turns
        # each of a batch's three turns is answered after STEP_S at least, inside the generation phase
        assert 3 * STEP_S <= mode["env_wait_s"] <= mode["gen_s"]
        assert mode["gen_model_s"] == pytest.approx(mode["gen_s"] - mode["env_wait_s"], abs=2e-4)
        assert mode["bound"] in ("generation", "environment", "training")
