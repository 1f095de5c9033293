"""Timeline arithmetic on hand-made spans, both pictures drawn from a small made-up run folder (single-turn,
and with episodes: the environment's spans and figures), and the exit codes of `cadence timeline` and
`cadence plot`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cadence.cli import main
from cadence.monitor.pictures import PictureError
from cadence.monitor.pictures.compare import draw_compare
from cadence.monitor.pictures.plot import draw_plot, moving_average, per_episode
from cadence.monitor.pictures.spans import (
    Span,
    Window,
    choose_window,
    clip,
    idle_gaps,
    parse_periods,
    period_starts,
    read_spans,
    row_order,
    seconds_by_period,
)
from cadence.monitor.pictures.timeline import draw_timeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# ---------------------------------------------------------------- a made-up run


def _period_spans(k: int, t0: float) -> list[dict[str, Any]]:
    """Period k starting at t0, 10 s long: workers load, generate two groups each, then wait; the trainer
    waits for the first group, trains, steps and publishes; the publish ends at t0 + 10."""
    return [
        {"actor": "rollout-0", "kind": "load", "start": t0, "end": t0 + 1, "period": k, "version": k},
        {
            "actor": "rollout-0",
            "kind": "generate",
            "start": t0 + 1,
            "end": t0 + 3,
            "period": k,
            "prompt_id": 0,
        },
        {
            "actor": "rollout-0",
            "kind": "generate",
            "start": t0 + 4,
            "end": t0 + 6,
            "period": k,
            "prompt_id": 2,
        },
        {"actor": "rollout-10", "kind": "load", "start": t0, "end": t0 + 1, "period": k, "version": k},
        {
            "actor": "rollout-10",
            "kind": "generate",
            "start": t0 + 1,
            "end": t0 + 5,
            "period": k,
            "prompt_id": 1,
        },
        {
            "actor": "rollout-2",
            "kind": "generate",
            "start": t0 + 1,
            "end": t0 + 2,
            "period": k,
            "prompt_id": 3,
        },
        {"actor": "trainer", "kind": "train", "start": t0 + 3, "end": t0 + 7, "period": k, "groups": 2},
        {"actor": "trainer", "kind": "train", "start": t0 + 7, "end": t0 + 8.5, "period": k, "groups": 2},
        {"actor": "trainer", "kind": "step", "start": t0 + 8.5, "end": t0 + 9, "period": k},
        {
            "actor": "trainer",
            "kind": "publish",
            "start": t0 + 9,
            "end": t0 + 10,
            "period": k,
            "version": k + 1,
        },
    ]


def _events(periods: int) -> list[dict[str, Any]]:
    first_publish = {"actor": "trainer", "kind": "publish", "start": 99.0, "end": 100.0, "period": -1}
    events = [first_publish]
    for k in range(periods):
        events += _period_spans(k, 100.0 + 10 * k)
    return events


def _spans(periods: int) -> list[Span]:
    return [Span(e["actor"], e["kind"], e["start"], e["end"], e["period"]) for e in _events(periods)]


def _run_dir(root: Path, periods: int = 10) -> Path:
    run = root / "run"
    (run / "logs").mkdir(parents=True)
    by_actor: dict[str, list[str]] = {}
    for e in _events(periods):
        line = json.dumps({**e, "event": "span", "level": "debug", "time": e["end"]})
        by_actor.setdefault(e["actor"], []).append(line)
    by_actor["trainer"].append(json.dumps({"event": "optimizer_step", "actor": "trainer"}))
    for actor, lines in by_actor.items():
        (run / "logs" / f"{actor}.jsonl").write_text("\n".join(lines) + "\n")
    (run / "logs" / "dispatcher.jsonl").write_text('{"event": "period_open", "period": 0}\n')
    rows = []
    for k in range(periods):
        row = {"period": k, "reward_mean": 0.1 * k / periods, "reward_std": 0.05, "accuracy": k / periods}
        row |= {
            "response_len_mean": 3.0 - k * 0.1,
            "tokens_per_s": 400.0 + k,
            "samples_per_s": 50.0,
            "period_s": 10.0,
        }
        if k % 3 == 0:
            del row["accuracy"]  # a key missing from some rows leaves those periods out
        rows.append(json.dumps(row))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return run


def _episode_run(root: Path, periods: int = 3) -> Path:
    """The made-up run as a run of episodes: each worker's generation holds environment waits (an eval
    round's too, in period 1), and each row the episode figures."""
    run = _run_dir(root, periods)
    for k in range(periods):
        t0 = 100.0 + 10 * k
        waits = [
            {"actor": "rollout-0", "kind": "environment", "start": t0 + 1.5, "end": t0 + 2.0, "period": k},
            {"actor": "rollout-0", "kind": "environment", "start": t0 + 4.5, "end": t0 + 5.5, "period": k},
            {"actor": "rollout-10", "kind": "environment", "start": t0 + 2, "end": t0 + 3, "period": k},
        ]
        if k == 1:
            waits.append(
                {"actor": "rollout-2", "kind": "environment", "start": t0 + 8, "end": t0 + 9.5, "period": k}
                | {"eval": True}
            )
        for e in waits:
            with (run / "logs" / f"{e['actor']}.jsonl").open("a") as f:
                f.write(json.dumps({**e, "event": "span", "level": "debug"}) + "\n")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for k, row in enumerate(rows):
        row |= {"samples": 8, "turns_mean": 1.5 + k, "tool_calls": 4 * k, "tool_errors": k, "env_timeouts": 0}
        row |= {"env_s": 0.8, "env_tokens": 40 + 8 * k, "ended_done": 6, "ended_max_turns": 2}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# ---------------------------------------------------------------- spans


def test_read_spans_keeps_only_span_events_in_time_order(tmp_path: Path) -> None:
    spans = read_spans(_run_dir(tmp_path, periods=2))
    assert len(spans) == 1 + 2 * 10
    assert [s.start for s in spans] == sorted(s.start for s in spans)
    assert {s.actor for s in spans} == {"trainer", "rollout-0", "rollout-2", "rollout-10"}


def test_environment_waits_a_period_are_those_of_the_worker_that_waited_longest(tmp_path: Path) -> None:
    spans = read_spans(_episode_run(tmp_path))
    assert [s.eval for s in spans if s.kind == "environment" and s.actor == "rollout-2"] == [True]
    # rollout-0 waits 0.5 + 1.0 s, rollout-10 1.0 s; rollout-2's 1.5 s are an eval round's
    assert seconds_by_period(spans, "environment") == {0: 1.5, 1: 1.5, 2: 1.5}
    assert seconds_by_period(_spans(3), "environment") == {}  # a single-turn run has none
    assert seconds_by_period(spans, "generate")[0] == 4.0  # rollout-0's two groups, rollout-10's one


def test_period_starts_are_the_ends_of_the_publishes_before() -> None:
    assert period_starts(_spans(3)) == {0: 100.0, 1: 110.0, 2: 120.0, 3: 130.0}


def test_default_window_is_four_periods_from_the_middle() -> None:
    assert choose_window(_spans(10)) == Window(first=3, last=6, start=130.0, end=170.0)
    assert choose_window(_spans(2)) == Window(first=0, last=1, start=100.0, end=120.0)
    assert choose_window(_spans(1)) == Window(first=0, last=0, start=100.0, end=110.0)


def test_a_given_window_is_kept_and_one_outside_the_run_refused() -> None:
    assert choose_window(_spans(10), (2, 2)) == Window(first=2, last=2, start=120.0, end=130.0)
    assert choose_window(_spans(10), (8, 20)) == Window(first=8, last=20, start=180.0, end=200.0)
    with pytest.raises(PictureError, match="no spans of periods 40 to 41: the run has periods 0 to 9"):
        choose_window(_spans(10), (40, 41))


def test_window_without_publishes_falls_back_to_its_spans() -> None:
    spans = [s for s in _spans(3) if s.kind != "publish"]
    assert choose_window(spans, (1, 1)) == Window(first=1, last=1, start=110.0, end=119.0)


def test_idle_gaps_are_exact() -> None:
    window = Window(first=1, last=1, start=110.0, end=120.0)
    gaps = idle_gaps(_spans(3), window)
    assert gaps["trainer"] == [(110.0, 113.0)]
    assert gaps["rollout-0"] == [(113.0, 114.0), (116.0, 120.0)]
    assert gaps["rollout-10"] == [(115.0, 120.0)]
    assert gaps["rollout-2"] == [(110.0, 111.0), (112.0, 120.0)]


def test_idle_gaps_start_when_an_actor_joins_and_end_when_it_leaves() -> None:
    late = [Span("rollout-1", "generate", 114.0, 115.0, 1), Span("rollout-1", "generate", 116.0, 117.0, 1)]
    gaps = idle_gaps(_spans(3) + late, Window(first=1, last=1, start=110.0, end=120.0))
    assert gaps["rollout-1"] == [(115.0, 116.0)]
    # a window wholly inside a worker's silence is one gap; one after it left has none
    gone = idle_gaps(late, Window(first=0, last=0, start=114.5, end=115.8))
    assert gone["rollout-1"] == [(115.0, 115.8)]
    assert idle_gaps(late, Window(first=3, last=3, start=130.0, end=140.0))["rollout-1"] == []


def test_clip_cuts_spans_to_the_window_and_drops_those_touching_its_edge() -> None:
    window = Window(first=1, last=1, start=110.0, end=120.0)
    clipped = clip(_spans(3), window)
    assert all(window.start <= s.start <= s.end <= window.end for s in clipped)
    kinds = [(s.actor, s.kind, s.period) for s in clipped]
    assert ("trainer", "publish", 0) not in kinds  # ends exactly at the window's start
    assert ("trainer", "publish", 1) in kinds
    assert len(clipped) == 10


def test_rows_put_the_trainer_first_and_workers_in_natural_order() -> None:
    actors = ["rollout-10", "rollout-2", "trainer", "rollout-host-7", "rollout-0", "publisher"]
    assert row_order(actors) == [
        "trainer",
        "publisher",
        "rollout-0",
        "rollout-2",
        "rollout-10",
        "rollout-host-7",
    ]


def test_parse_periods() -> None:
    assert parse_periods("3:7") == (3, 7)
    assert parse_periods("5") == (5, 5)
    for bad in ("7:3", "a:b", "-1:2", "3:"):
        with pytest.raises(ValueError):
            parse_periods(bad)


def test_moving_average_is_trailing() -> None:
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


# ---------------------------------------------------------------- pictures


def test_timeline_png_and_svg(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    png = draw_timeline(run, tmp_path / "pics" / "timeline.png", None)
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and 10_000 < len(data) < 2_000_000
    svg = draw_timeline(run, tmp_path / "timeline.svg", (0, 9)).read_text()
    for actor in ("trainer", "rollout-0", "rollout-2", "rollout-10"):
        assert f">{actor}<" in svg
    assert "periods 0 to 9 of 10" in svg


def test_a_timeline_of_episodes_draws_the_environment_waits_and_their_mean(tmp_path: Path) -> None:
    svg = draw_timeline(_episode_run(tmp_path), tmp_path / "timeline.svg", (0, 2)).read_text()
    assert ">environment<" in svg  # in the legend
    assert "environment 1.50 s" in svg  # the title's mean a period
    plain = draw_timeline(_run_dir(tmp_path / "plain", 3), tmp_path / "plain.svg", (0, 2)).read_text()
    assert "environment" not in plain


def test_per_episode_divides_a_periods_sum_by_its_episodes() -> None:
    rows = [
        {"period": 0, "samples": 8, "tool_calls": 12},
        {"period": 1, "samples": 0, "tool_calls": 0},  # no episode: left out
        {"period": 2, "tool_calls": 3},  # no count of episodes: left out
        {"period": 3, "samples": 4, "tool_calls": 2},
    ]
    assert per_episode(rows, "tool_calls") == ([0.0, 3.0], [1.5, 0.5])
    assert per_episode(rows, "env_s") == ([], [])


def test_plot_of_an_episode_run_adds_the_episode_panels(tmp_path: Path) -> None:
    svg = draw_plot(_episode_run(tmp_path), tmp_path / "plot.svg").read_text()
    labels = ("model turns", "tool calls", "tool errors", "environment timeouts")
    for label in (*labels, "seconds in environment calls", "environment tokens", "tokens an episode"):
        assert label in svg, label
    plain = draw_plot(_run_dir(tmp_path / "plain", 3), tmp_path / "plain.svg").read_text()
    assert not any(label in plain for label in labels)


def test_plot_png(tmp_path: Path) -> None:
    data = draw_plot(_run_dir(tmp_path, periods=50), tmp_path / "plot.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and 20_000 < len(data) < 3_000_000


def test_plot_without_a_panel_key_still_draws(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"period": k, "reward_mean": 0.5}) + "\n" for k in range(3))
    )
    svg = draw_plot(run, tmp_path / "plot.svg").read_text()
    assert "no accuracy in metrics.jsonl" in svg
    assert "held out" not in svg  # no eval.jsonl: no eval curve


def test_plot_draws_the_eval_rounds_of_a_run_with_eval(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, periods=10)
    rows = [
        {"period": k, "eval_accuracy": k / 10, "eval_pass_at_k": k / 8, "eval_reward": k / 9}
        for k in (0, 5, 10)
    ]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    svg = draw_plot(run, tmp_path / "plot.svg").read_text()
    for label in ("eval accuracy (held out)", "eval pass@k (held out)", "eval reward (held out)"):
        assert label in svg


def test_several_runs_are_drawn_side_by_side_by_their_folder_names(tmp_path: Path) -> None:
    tool = _episode_run(tmp_path / "a").rename(tmp_path / "with-tool")
    (tool / "eval.jsonl").write_text(
        "".join(json.dumps({"period": k, "eval_accuracy": k / 2}) + "\n" for k in (0, 2))
    )
    single = _run_dir(tmp_path / "b", 3).rename(tmp_path / "single")
    svg = draw_compare([tool, single], tmp_path / "compare.svg").read_text()
    assert "with-tool vs single" in svg
    for title in ("held-out eval accuracy", "training reward (mean a period)", "tool calls an episode"):
        assert title in svg
    assert "no eval.jsonl rounds" not in svg and "no run played episodes" not in svg
    # two runs without episodes or eval rounds: those panels say so; folders of one name: their paths
    svg = draw_compare(
        [single, _run_dir(tmp_path / "c", 3).rename(tmp_path / "c" / "single")], tmp_path / "plain.svg"
    ).read_text()
    assert "no run played episodes" in svg and "no eval.jsonl rounds" in svg
    assert str(single) in svg
    with pytest.raises(PictureError, match="no run folder"):
        draw_compare([single, tmp_path / "missing"], tmp_path / "x.svg")


def test_runs_side_by_side_against_seconds_put_a_period_at_its_end_and_a_round_at_its_start(
    tmp_path: Path,
) -> None:
    from cadence.monitor.pictures.compare import period_ends

    rows = [{"period": 1, "period_s": 3.0}, {"period": 0, "period_s": 2.0}, {"period": 2, "period_s": 5.0}]
    assert period_ends(rows) == {0: 2.0, 1: 5.0, 2: 10.0}
    single = _run_dir(tmp_path / "b", 3).rename(tmp_path / "single")
    (single / "eval.jsonl").write_text(
        "".join(json.dumps({"period": k, "eval_accuracy": k / 3}) + "\n" for k in (0, 3))
    )
    other = _run_dir(tmp_path / "c", 3).rename(tmp_path / "other")
    svg = draw_compare([single, other], tmp_path / "seconds.svg", seconds=True).read_text()
    assert "seconds since the run's start" in svg and ">period<" not in svg


# ---------------------------------------------------------------- the command


def test_commands_write_the_pictures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, periods=3)
    out = tmp_path / "t.svg"
    assert main(["timeline", str(run), "-o", str(out), "--periods", "1:2"]) == 0
    assert main(["plot", str(run), "-o", str(tmp_path / "p.png")]) == 0
    other = _run_dir(tmp_path / "other", periods=2)
    assert main(["plot", str(run), str(other), "-o", str(tmp_path / "c.svg")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"cadence: wrote {out}",
        f"cadence: wrote {tmp_path / 'p.png'}",
        f"cadence: wrote {tmp_path / 'c.svg'}",
    ]
    assert f"{run} vs {other}" in (tmp_path / "c.svg").read_text()  # two folders named run: their paths


def test_commands_refuse_what_they_cannot_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run = _run_dir(tmp_path, periods=3)
    cases = [
        (["timeline", str(empty), "-o", str(tmp_path / "t.png")], "no span events in"),
        (["timeline", str(tmp_path / "missing"), "-o", str(tmp_path / "t.png")], "no run folder"),
        (
            ["timeline", str(run), "-o", str(tmp_path / "t.png"), "--periods", "7:9"],
            "no spans of periods 7 to 9",
        ),
        (["timeline", str(run), "-o", str(tmp_path / "t.gif")], "cannot tell the picture format"),
        (["plot", str(empty), "-o", str(tmp_path / "p.png")], "no periods in"),
    ]
    for argv, message in cases:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "p.png").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["timeline", str(run), "-o", str(tmp_path / "t.png"), "--periods", "9:7"])
    assert exit_.value.code == 2


def test_plot_of_a_run_that_measures_the_engine_learner_gap_adds_its_panels(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "gap", 4)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for k, row in enumerate(rows):
        row |= {"mismatch_kl": 1e-6 * (k + 1), "mismatch_beyond_token_share": 0.001 * k}
        row |= {"mismatch_ratio_min": 0.5, "mismatch_ratio_mean": 1.0, "mismatch_ratio_max": 2.0 + k}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    svg = draw_plot(run, tmp_path / "gap.svg").read_text()
    for label in ("engine-learner gap", "tokens beyond the bound", "token ratio", "largest", "smallest"):
        assert label in svg, label
    plain = draw_plot(_run_dir(tmp_path / "plain", 3), tmp_path / "plain.svg").read_text()
    assert "engine-learner gap" not in plain
