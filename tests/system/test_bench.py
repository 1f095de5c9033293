"""`cadence bench pipeline --json` runs both modes on real processes and ends with its JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.bench.weights_device import device_problem
from cadence.monitor.run_dir import read_jsonl
from cadence.transport.shared_memory import sharing_problem
from tests.system.helpers import cadence

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


def test_bench_pipeline_prints_its_figures_as_json(tmp_path: Path) -> None:
    small = ["periods=3", "rollout.workers=2", "task.prompts_per_period=8", "simulated.length_median=50"]
    args = [a for s in small for a in ("--set", s)]
    proc = cadence("bench", "pipeline", "--json", "--out", str(tmp_path), *args)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("sync_period_s", "periodic_period_s", "speedup", "ideal_period_s", "efficiency"):
        assert figures[key] > 0, key
    assert figures["speedup"] == pytest.approx(
        figures["sync_period_s"] / figures["periodic_period_s"], rel=1e-3
    )
    assert figures["tail_s"] >= 0 and "groups_stopped" not in figures  # no [sampling]: no such figures
    for mode in ("sync", "periodic"):
        rows = read_jsonl(tmp_path / mode / "metrics.jsonl")
        assert len(rows) == 3 and all(r["groups"] == 8 for r in rows)
        assert json.loads((tmp_path / mode / "config.json").read_text())["mode"] == mode
    # in sync mode training starts only after the last group is in: nothing overlaps
    assert all(r["overlap_s"] == 0.0 for r in read_jsonl(tmp_path / "sync" / "metrics.jsonl"))
    assert any(r["overlap_s"] > 0.0 for r in read_jsonl(tmp_path / "periodic" / "metrics.jsonl"))


def test_bench_signing_prints_the_cost_of_each_signed_message() -> None:
    lines = cadence("bench", "signing", "--json").stdout.strip().splitlines()
    assert len(lines) == 1  # nothing but the figures on stdout
    figures = json.loads(lines[0])
    for tag in ("consumed", "version_ready", "run_done"):
        assert figures[f"{tag}_sign_us"] > 0 and figures[f"{tag}_check_us"] > 0, tag
    per_group = figures["consumed_sign_us"] + figures["consumed_check_us"]
    per_version = figures["version_ready_sign_us"] + figures["version_ready_check_us"]
    assert figures["period_us"] == pytest.approx(
        figures["prompts_per_period"] * per_group + per_version, abs=0.1
    )


def test_bench_agents_prints_what_the_endpoint_costs_beside_the_engine() -> None:
    lines = cadence("bench", "agents", "--json").stdout.strip().splitlines()
    assert len(lines) == 1  # nothing but the figures on stdout
    figures = json.loads(lines[0])
    assert figures["bench"] == "agents" and len(figures["load_avg"]) == 3
    for engine in ("instant", "tiny"):
        for agents in (1, 16, 64):
            name = f"{engine}_{agents}"
            assert figures[f"{name}_engine_rows"] == figures["calls_an_agent"] * agents, name
            assert 1 <= figures[f"{name}_engine_calls"] <= figures[f"{name}_engine_rows"], name
            assert figures[f"{name}_wall_s"] > 0 and figures[f"{name}_call_ms_mean"] > 0, name


def test_bench_wire_prints_what_each_message_costs_the_codec() -> None:
    lines = cadence("bench", "wire", "--json").stdout.strip().splitlines()
    assert len(lines) == 1  # nothing but the figures on stdout
    figures = json.loads(lines[0])
    assert figures["bench"] == "wire" and figures["protocol"] >= 1 and len(figures["load_avg"]) == 3
    for tag in ("group_result", "weight_chunk", "heartbeat"):
        for name in ("header_bytes", "encode_us", "decode_us"):
            assert figures[f"{tag}_{name}"] > 0, (tag, name)
    assert figures["chunk_bytes"] == 4 << 20 and figures["group_size"] * figures["tokens"] > 0


def test_bench_logs_counts_every_event_through_both_paths() -> None:
    proc = cadence("bench", "logs", "--json")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # nothing but the figures on stdout
    figures = json.loads(lines[0])
    assert figures["stream_events"] == figures["file_events"] == 4 * 25_000
    assert figures["stream_events_per_s"] > 0 and figures["file_events_per_s"] > 0
    assert figures["stream_events_per_s"] == pytest.approx(
        figures["stream_events"] / figures["stream_s"], rel=1e-2
    )


def test_bench_weights_reports_each_transport_against_the_raw_wire() -> None:
    proc = cadence("bench", "weights", "--json", "--mbytes", "8")
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # nothing but the figures on stdout
    figures = json.loads(lines[0])
    assert figures["bytes"] == 8_000_000 and figures["workers"] == 2
    assert figures["raw_seconds"] > 0 and figures["raw_gbps"] > 0 and figures["load_1min"] >= 0
    shared = {"shm"} if sharing_problem() is None else set()  # the same-host transport, where it can
    on_device = {"cuda-ipc"} if device_problem() is None else set()  # where torch sees a GPU
    assert set(figures["transports"]) == {"zmq", "gloo"} | shared | on_device
    for entry in figures["transports"].values():
        assert set(entry) == {"seconds", "gbps", "ratio_to_raw"}
        assert entry["seconds"] > 0 and entry["gbps"] > 0
        assert entry["ratio_to_raw"] == pytest.approx(figures["raw_seconds"] / entry["seconds"], rel=1e-2)


def test_bench_e2e_runs_both_modes_of_a_real_config_and_reports_each_part() -> None:
    small = ["--set", "task.prompts_per_period=4", "--set", "rollout.group_size=8"]
    args = ["--json", "--config", "configs/quickstart.toml", "--periods", "3", *small]
    proc = cadence("bench", "e2e", *args, timeout=280)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("sync_period_s", "periodic_period_s", "speedup", "train_s", "gen_s", "tokens_kept"):
        assert figures[key] > 0, key
    assert 0 <= figures["tokens_trained"] <= figures["tokens_kept"]  # a group of equal rewards trains none
    for key in ("trainer_idle_s", "step_s", "publish_s", "load_s"):
        assert figures[key] >= 0, key
        assert figures["sync"][key] >= 0, key
    assert figures["speedup"] == pytest.approx(
        figures["sync_period_s"] / figures["periodic_period_s"], rel=1e-3
    )
    assert figures["periods_measured"] == 1
    assert figures["tokens_trained"] == figures["sync"]["tokens_trained"]  # same prompts, same lengths
    assert figures["tokens_kept"] == figures["sync"]["tokens_kept"]
    assert 0 <= figures["reward_mean_last"] <= 1
    assert (
        len(figures["load_avg"]) == 2
        and figures["sync"]["trainer_threads"] >= figures["trainer_threads"] >= 1
    )
    # every actor of the run measured from outside, and only those (quickstart: two workers)
    peaks = figures["peak_memory_mib"]
    assert set(peaks) == {"dispatcher", "trainer", "rollout-0", "rollout-1"}
    assert all(peak["rss_mib"] > 10 for peak in peaks.values()), peaks
    assert (figures["trainer_device"], figures["rollout_device"], figures["trainer_precision"]) == (
        "cpu",
        "cpu",
        "fp32",
    )


def test_bench_tail_runs_each_variant_and_measures_the_arrival_bias(tmp_path: Path) -> None:
    small = ["--set", "task.prompts_per_period=4", "--set", "rollout.group_size=8"]
    variants = "base,over50+zv,over50+zv@prompt"
    args = ["--json", "--config", "configs/quickstart.toml", "--periods", "2", "--rounds", "1"]
    proc = cadence(
        "bench", "tail", *args, "--variants", variants, "--out", str(tmp_path), *small, timeout=200
    )
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "tail" and list(figures["variants"]) == variants.split(",")
    for name, f in figures["variants"].items():
        assert f["periods_measured"] == 1 and f["period_s"] > 0 and f["reward_per_s"] >= 0, name
        assert f["groups"] <= 4 and f["prompts_issued"] >= f["groups"], name
        assert f["speedup_vs_base"] == pytest.approx(
            figures["variants"]["base"]["period_s"] / f["period_s"], rel=1e-2
        )
        run = tmp_path / f"tail-r0-{name}"  # each variant's own run, its [sampling] as named
        sampling = json.loads((run / "config.json").read_text())["sampling"]
        assert sampling["oversample"] == (0.0 if name == "base" else 0.5), name
        assert sampling["order"] == ("prompt" if name.endswith("@prompt") else "arrival"), name
        assert len(read_jsonl(run / "metrics.jsonl")) == 2
    assert figures["variants"]["base"]["prompts_issued"] == 4
    bias = figures["arrival_bias"]["over50+zv"]
    assert set(bias) == {"period0", "all_periods"}
    assert set(bias["period0"]) == {
        "len_arrival",
        "len_prompt",
        "len_diff",
        "reward_arrival",
        "reward_prompt",
        "reward_diff",
    }
    assert len(figures["load_avg"]) == 2


def test_bench_e2e_names_make_smollm2_when_the_checkpoint_is_missing(tmp_path: Path) -> None:
    missing = f"model.checkpoint='{tmp_path / 'none'}'"
    proc = cadence("bench", "e2e", "--json", "--set", missing, check=False)
    assert proc.returncode == 2
    assert "make smollm2" in proc.stderr


def test_bench_strangers_counts_every_forged_group_refused_undecoded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cadence.bench.strangers import bench_strangers

    assert bench_strangers(True, connections=4, frames=2, transfer_mib=16) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    attack = figures["attack"]
    assert attack["refused"] == attack["undecoded"] == 4 * 2 and attack["frame_bytes"] > 2 << 20
    assert figures["transfer_mib"] == 16 and set(figures["transfer_s"]) == {
        "tcp_loopback",
        "ipc_0700",
        "tcp_loopback_curve",
    }


def test_bench_generate_full_length_gives_every_engine_the_same_work() -> None:
    """The tiny model, the built-in engine eager and compiled beside transformers: with
    ``--full-length`` each makes every sample its whole limit, so all count rows x limit tokens; the
    compiled engine drew the eager one's samples to the bit, and the summary says so."""
    args = ["--models", "tiny", "--rows", "8", "--dtypes", "float32", "--new-tokens", "6", "--repeats", "1"]
    lines = cadence("bench", "generate", "--json", *args, "--gen-engines", "eager,compiled,transformers",
                    "--full-length").stdout.strip().splitlines()  # fmt: skip
    cases = [json.loads(line) for line in lines[:-1]]
    assert [c["engine"] for c in cases] == ["eager", "compiled", "transformers"]
    for case in cases:
        assert "error" not in case, case
        assert case["full_length"] and case["tokens"] == 8 * 6 and case["tokens_per_s"] > 0
    assert cases[1]["compiled"] and cases[1]["warm_up_s"] > 0
    summary = json.loads(lines[-1])
    assert summary["cases"] == 3 and summary["compiled_equals_eager"] == {"tiny/8/float32/6": True}
