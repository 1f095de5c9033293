"""Every actor of a run in one event loop on in-process channels, with the real model and engine.

Shows the central claim: with the same seed, `sync` and `periodic` generate identical tokens and end
with the same weights (up to floating-point summation order; to the bit in prompt order, with any
number of workers).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from safetensors.torch import load_file

from cadence.actors.dispatcher import Dispatcher
from cadence.actors.publisher import Publisher
from cadence.actors.rollout import RolloutWorker
from cadence.actors.trainer import Trainer
from cadence.config import RunConfig
from cadence.launch.build import make_engine, make_group_maker, make_learner, make_tokenizer
from cadence.launch.settings import dispatcher_settings, liveness, session, trainer_settings, worker_settings
from cadence.monitor.run_dir import RunRecorder, read_jsonl
from cadence.tasks.registry import make_task
from cadence.training.learner import Learner, TorchLearner
from cadence.training.resume import RunRecord, ask_for_checkpoint, checkpoint_asked, find_resume
from cadence.transport.inproc import InprocNetwork
from cadence.transport.weights import WeightStore
from cadence.wire.buffer import Buffer
from tests.conftest import tiny_config

pytestmark = pytest.mark.timeout(120)


async def run_inproc(
    cfg: RunConfig,
    out: Path,
    beside: Callable[[Dispatcher], Awaitable[None]] | None = None,
    learner: Learner | None = None,
) -> dict[str, Any]:
    """The run's summary; `beside`, run alongside the actors, is handed the dispatcher; `learner`:
    the trainer's (else the config's)."""
    net = InprocNetwork(run=cfg.run_id)
    tokenizer = make_tokenizer(cfg)
    task = make_task(cfg.task, cfg.seed)
    dispatcher = Dispatcher(
        dispatcher_settings(cfg),
        net.bind("dispatcher", "inproc://d"),
        task,
        RunRecorder(out, cfg.mode),
        liveness(cfg, time.time),
        time.time,
    )
    publisher = Publisher(
        net.bind("publisher", "inproc://p"),
        session(cfg, net.connect("publisher", "inproc://d"), "publisher", time.time, "inproc://p"),
        WeightStore(cfg.weights.chunk_bytes, cfg.weights.keep_versions),
    )
    trainer = Trainer(
        trainer_settings(cfg, tokenizer.vocab_size),
        net.bind("trainer", "inproc://t"),
        session(cfg, net.connect("trainer", "inproc://d"), "trainer", time.time, "inproc://t"),
        learner or make_learner(cfg, tokenizer),
        publisher.publish,
        time.time,
        out / "checkpoints",
        RunRecord.of(cfg),
    )
    workers = [
        RolloutWorker(
            worker_settings(cfg),
            f"w{i}",
            session(cfg, net.connect(f"w{i}", "inproc://d"), "rollout", time.time),
            net.connect,
            make_group_maker(cfg, tokenizer, make_engine(cfg, tokenizer), None),
            time.time,
        )
        for i in range(cfg.rollout.workers)
    ]
    others = [beside(dispatcher)] if beside is not None else []
    await asyncio.gather(
        dispatcher.run(), trainer.run(), publisher.run(), *(w.run() for w in workers), *others
    )
    net.close()
    return dict(json.loads((out / "summary.json").read_text()))


@pytest.mark.parametrize("steps", [1, 2])
async def test_sync_and_periodic_generate_the_same_tokens_and_weights(tmp_path: Path, steps: int) -> None:
    results = {}
    for mode in ("sync", "periodic"):
        cfg = tiny_config(
            f"mode={mode}", "periods=4", "transport.liveness=100", f"trainer.steps_per_period={steps}"
        )
        summary = await run_inproc(cfg, tmp_path / mode)
        rows = read_jsonl(tmp_path / mode / "metrics.jsonl")
        weights = load_file(str(tmp_path / mode / "checkpoints" / "final" / "model.safetensors"))
        results[mode] = (summary, rows, weights)
        assert summary["groups_trained"] == 4 * 4 and summary["stale_dropped"] == 0
        assert summary["duplicates_dropped"] == 0 and summary["final_version"] == 4
    (s_sum, s_rows, s_w), (p_sum, p_rows, p_w) = results["sync"], results["periodic"]
    assert [r["samples_sha256"] for r in s_rows] == [r["samples_sha256"] for r in p_rows]
    assert len({r["samples_sha256"] for r in s_rows}) == 4  # periods differ: the check has teeth
    assert s_w.keys() == p_w.keys()
    diff = max(float((s_w[k] - p_w[k]).abs().max()) for k in s_w)
    assert diff <= 1e-5
    initial = make_learner(tiny_config(), make_tokenizer(tiny_config())).model.state_dict()  # type: ignore[attr-defined]
    moved = max(float((p_w[k] - initial[k]).abs().max()) for k in p_w)
    assert moved > 1e-4  # training changed the weights, so equal weights mean equal training
    assert s_sum["weights_sha256"] and p_sum["weights_sha256"]


class Unstaged(TorchLearner):
    """A learner that serialises every version (nothing staged)."""

    def stage(self, alloc: Callable[[int], Buffer], dtype: str | None = None) -> str | None:
        return "not in this run"


async def test_a_run_whose_versions_are_staged_equals_one_that_serialises_each(tmp_path: Path) -> None:
    """The trainer moves the parameters into each next version's buffer while the workers begin: the
    same tokens, the same versions, the same final weights, bit for bit."""
    cfg = tiny_config("periods=4", "transport.liveness=100", "trainer.steps_per_period=2")
    tokenizer = make_tokenizer(cfg)
    staged = make_learner(cfg, tokenizer)
    plain = make_learner(cfg, tokenizer)
    assert isinstance(staged, TorchLearner) and type(plain) is TorchLearner
    plain.__class__ = Unstaged
    with structlog.testing.capture_logs() as logs:
        await run_inproc(cfg, tmp_path / "staged", learner=staged)
    assert [e["version"] for e in logs if e["event"] == "version_staged"] == [1, 2, 3, 4]
    assert staged.versions.moves == 0
    with structlog.testing.capture_logs() as logs:
        await run_inproc(cfg, tmp_path / "plain", learner=plain)
    assert [e["event"] for e in logs].count("versions_not_staged") == 1
    rows = {run: read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("staged", "plain")}
    assert [r["samples_sha256"] for r in rows["staged"]] == [r["samples_sha256"] for r in rows["plain"]]
    final = {run: (tmp_path / run / "checkpoints/final/model.safetensors").read_bytes() for run in rows}
    assert final["staged"] == final["plain"]


OVERSAMPLED = (
    "sampling.oversample=1.0",
    "sampling.filters=['zero_variance']",
    "sampling.order='prompt'",
    "sampling.ceiling=3",
    "rollout.inflight=3",
    "rollout.group_size=8",
    "task.reward='distance'",  # partial credit: some groups' rewards differ, many do not
)


async def test_over_sampled_sync_and_periodic_in_prompt_order_train_the_same_groups(tmp_path: Path) -> None:
    """Over-sampling, the zero-variance filter, refills and the stop of the rest: in prompt order the
    kept groups do not depend on when groups arrive, so sync and periodic still train the same tokens
    and end with the same weights."""
    results = {}
    for mode in ("sync", "periodic"):
        cfg = tiny_config(f"mode={mode}", "periods=4", "transport.liveness=100", *OVERSAMPLED)
        await run_inproc(cfg, tmp_path / mode)
        rows = read_jsonl(tmp_path / mode / "metrics.jsonl")
        weights = load_file(str(tmp_path / mode / "checkpoints" / "final" / "model.safetensors"))
        results[mode] = (rows, weights)
        for r in rows:
            assert 8 <= r["prompts_issued"] <= 12 and r["stale_dropped"] == 0
            assert r["prompts_issued"] >= r["groups_arrived"] and r["groups_stopped"] >= 0
            assert r["groups"] <= 4 and r["groups_arrived"] >= r["groups"] + r["groups_filtered"]
            assert r["groups_filtered"] == sum(v for k, v in r.items() if k.startswith("filtered_"))
    (s_rows, s_w), (p_rows, p_w) = results["sync"], results["periodic"]
    assert [r["samples_sha256"] for r in s_rows] == [r["samples_sha256"] for r in p_rows]
    assert [(r["groups"], r["groups_filtered"]) for r in s_rows] == [
        (r["groups"], r["groups_filtered"]) for r in p_rows
    ]
    assert [(r["prompts_issued"], r["groups_stopped"]) for r in s_rows] == [
        (r["prompts_issued"], r["groups_stopped"]) for r in p_rows
    ]
    # the filter had something to do, a period drew more, one fell short, one stopped its rest
    assert sum(r["groups_filtered"] for r in s_rows) > 0 and any(r["prompts_issued"] > 8 for r in s_rows)
    assert any(r["groups"] < 4 for r in s_rows) and any(r["groups_stopped"] > 0 for r in s_rows)
    diff = max(float((s_w[k] - p_w[k]).abs().max()) for k in s_w)
    assert diff <= 1e-5


@pytest.mark.parametrize("budget", [4096, 40], ids=["one-micro-batch", "several"])
async def test_in_prompt_order_two_workers_sync_and_periodic_end_bit_for_bit_alike(
    tmp_path: Path, budget: int
) -> None:
    """`sampling.order = 'prompt'`: whichever worker sends a group first, the trainer takes the groups
    in prompt order and cuts its micro-batches by the budget alone, so sync and periodic (each with two
    workers racing) train the same micro-batches: the same tokens and the same weights, to the bit."""
    finals, rows = {}, {}
    for mode in ("sync", "periodic"):
        cfg = tiny_config(
            f"mode={mode}",
            "periods=4",
            "rollout.workers=2",
            "task.prompts_per_period=8",
            "sampling.order='prompt'",
            f"trainer.micro_batch_tokens={budget}",
            "transport.liveness=100",
        )
        await run_inproc(cfg, tmp_path / mode)
        rows[mode] = read_jsonl(tmp_path / mode / "metrics.jsonl")
        finals[mode] = (tmp_path / mode / "checkpoints/final/model.safetensors").read_bytes()
    assert [r["samples_sha256"] for r in rows["sync"]] == [r["samples_sha256"] for r in rows["periodic"]]
    assert all(r["groups"] == 8 for r in rows["sync"] + rows["periodic"])
    assert max(r["workers_active"] for r in rows["periodic"]) == 2
    if budget == 40:  # the budget cut the periods' groups into several micro-batches
        assert all(r["micro_batches"] > 1 for r in rows["periodic"])
    assert finals["sync"] == finals["periodic"]


async def test_two_workers_share_the_work_and_every_group_is_trained_once(tmp_path: Path) -> None:
    cfg = tiny_config("rollout.workers=2", "periods=3", "task.prompts_per_period=6", "transport.liveness=100")
    summary = await run_inproc(cfg, tmp_path)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert summary["groups_trained"] == 3 * 6 and summary["samples"] == 3 * 6 * 4
    assert all(r["groups"] == 6 and r["stale_dropped"] == 0 for r in rows)
    assert max(r["workers_active"] for r in rows) == 2
    assert torch.isfinite(torch.tensor([r["reward_mean"] for r in rows])).all()


async def test_a_run_stopped_after_its_checkpoint_ends_at_that_checkpoints_version(tmp_path: Path) -> None:
    """`cadence slurm stop`: a checkpoint asked for with "stop" is the trainer's last; the dispatcher,
    stopped once it has the row before it, sums exactly the periods the checkpoint holds."""
    cfg = tiny_config("periods=50", "transport.liveness=100")
    root = tmp_path / "checkpoints"

    async def stop_after_checkpoint(dispatcher: Dispatcher) -> None:
        while not read_jsonl(tmp_path / "metrics.jsonl"):  # a period or more done
            await asyncio.sleep(0.01)
        root.mkdir(parents=True, exist_ok=True)
        ask_for_checkpoint(root, then_stop=True)
        while checkpoint_asked(root):
            await asyncio.sleep(0.01)
        found = find_resume(root)
        assert found is not None
        version = found[1]["version"]
        while len(read_jsonl(tmp_path / "metrics.jsonl")) < version:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # a trainer that went on would report more periods meanwhile
        dispatcher.stop()

    summary = await run_inproc(cfg, tmp_path, stop_after_checkpoint)
    found = find_resume(root)
    assert found is not None and summary["stopped"]
    assert summary["final_version"] == summary["periods"] == found[1]["version"] < 50
    assert [r["period"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(summary["periods"]))


def make_checkpoint(directory: Path) -> Path:
    """A tiny random Llama in Hugging Face layout with a word-level tokenizer and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from cadence.model.checkpoint import save_checkpoint
    from cadence.model.config import ModelConfig
    from cadence.model.transformer import init_model

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "\n": 3}
    for token in [
        *"0123456789+?.",
        *["What", "is", "Answer", "with", "the", "number", "only", "user", "assistant"],
    ]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)]
    )
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
    )
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    model_cfg = ModelConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, max_position=128)
    save_checkpoint(init_model(model_cfg, 5), model_cfg, directory)
    return directory


async def test_a_run_from_a_checkpoint_with_its_own_tokenizer(tmp_path: Path) -> None:
    from cadence.model.checkpoint import load_checkpoint, state_dict_to_bytes
    from cadence.model.hf_tokenizer import HFTokenizer
    from cadence.wire.digest import checksum

    source = make_checkpoint(tmp_path / "source")
    cfg = tiny_config("task.name='arithmetic'", f"model.checkpoint='{source}'", "rollout.max_new_tokens=3")
    summary = await run_inproc(cfg, tmp_path / "run")
    assert summary["groups_trained"] == 3 * 4 and summary["stale_dropped"] == 0
    final = tmp_path / "run" / "checkpoints" / "final"
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"} <= {
        p.name for p in final.iterdir()
    }
    tokenizer = HFTokenizer(final)
    assert tokenizer.encode_prompt("What is 1 + 2?")[:1] == [1]  # the chat template came along
    trained, _ = load_checkpoint(final)
    assert checksum(state_dict_to_bytes(trained)) == summary["weights_sha256"]
    assert (final / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()
