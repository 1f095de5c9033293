"""A user's mistakes with files: each is named by its path in one line, and nothing is lost by it."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from cadence.config import ConfigError, load_config
from cadence.launch.build import make_learner, make_model, make_tokenizer
from cadence.launch.launcher import LaunchError, check_out, prepare
from cadence.model.checkpoint import CheckpointError, check_checkpoint, load_checkpoint
from cadence.model.hf_tokenizer import HFTokenizer, open_tokenizer
from cadence.model.tokenizer import CharTokenizer
from cadence.training.resume import ResumeError, RunRecord, find_resume, load_resume, save_resume
from tests.conftest import tiny_config

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")


def char_checkpoint(folder: Path) -> tuple[CharTokenizer, Path]:
    """cadence's own final checkpoint of a tiny run: the digits task's character tokenizer."""
    cfg = tiny_config()
    tokenizer = make_tokenizer(cfg)
    assert isinstance(tokenizer, CharTokenizer)
    learner = make_learner(cfg, tokenizer)
    learner.save(folder)
    return tokenizer, folder


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"config file {tmp_path / 'nope.toml'} not found"):
        load_config(tmp_path / "nope.toml")


def test_out_that_is_a_file_or_holds_a_run_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    with pytest.raises(LaunchError, match="is a file, not a folder"):
        check_out(tmp_path / "file", overwrite=True)
    check_out(tmp_path / "new", overwrite=False)  # a folder that does not exist yet, or is empty
    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"period": 0}\n')
    with pytest.raises(LaunchError, match="holds a run .*--overwrite .*--resume"):
        prepare(tiny_config(), run)
    assert (run / "checkpoints" / "final").is_dir() and (run / "metrics.jsonl").read_text()
    prepare(tiny_config(), run, overwrite=True)
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert json.loads((run / "config.json").read_text())["run_id"]


def test_a_missing_or_truncated_checkpoint_file_is_named(tmp_path: Path) -> None:
    _, folder = char_checkpoint(tmp_path / "final")
    check_checkpoint(folder)
    with pytest.raises(CheckpointError, match=f"checkpoint folder {tmp_path / 'none'} not found"):
        check_checkpoint(tmp_path / "none")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    for check in (check_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match=f"{weights} is truncated or not safetensors"):
            check(folder)
    weights.unlink()
    with pytest.raises(CheckpointError, match=f"{folder} holds neither model.safetensors"):
        load_checkpoint(folder)
    (folder / "config.json").write_text("")
    with pytest.raises(CheckpointError, match=f"{folder / 'config.json'} is empty or damaged"):
        load_checkpoint(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=f"{folder / 'tokenizer.json'} not found"):
        open_tokenizer(folder)


def test_cadences_char_checkpoint_opens_in_transformers_and_as_model_checkpoint(tmp_path: Path) -> None:
    char, folder = char_checkpoint(tmp_path / "final")
    text = "1234"  # the digits task's alphabet
    hf = open_tokenizer(folder)
    assert isinstance(hf, HFTokenizer)
    assert (hf.vocab_size, hf.pad_id, hf.eos_id, hf.bos_id) == (char.vocab_size, 0, 2, 1)
    assert hf.encode(text) == char.encode(text) and hf.encode_prompt(text) == char.encode_prompt(text)
    ids = [*char.encode(text), char.pad_id, char.eos_id]
    assert hf.decode_response(ids) == char.decode_response(ids) and hf.decode(ids) == text
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    assert auto(text).input_ids == char.encode_prompt(text)
    assert auto.decode(char.encode(text)) == text and auto.eos_token_id == char.eos_id
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours, _ = load_checkpoint(folder)
    prompt = torch.tensor([char.encode_prompt(text)])
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, ours(prompt), rtol=1e-4, atol=1e-5)
    # and as model.checkpoint of a new run: the same ids, the same weights
    cfg = tiny_config(f"model.checkpoint='{folder}'")
    tokenizer = make_tokenizer(cfg)
    assert tokenizer.encode_prompt(text) == char.encode_prompt(text)
    with torch.no_grad():
        torch.testing.assert_close(make_model(cfg, tokenizer)[0](prompt), ours(prompt))


def test_an_older_checkpoints_char_tokenizer_still_reads(tmp_path: Path) -> None:
    char = CharTokenizer("0123456789")
    (tmp_path / "tokenizer.json").write_text(json.dumps(char.to_dict()))
    old = open_tokenizer(tmp_path)
    assert isinstance(old, CharTokenizer) and old.encode_prompt("42") == char.encode_prompt("42")


def test_an_empty_state_or_truncated_resume_file_is_named(tmp_path: Path) -> None:
    cfg = tiny_config("trainer.checkpoint_every=1")
    tokenizer = make_tokenizer(cfg)
    learner = make_learner(cfg, tokenizer)
    where = save_resume(tmp_path, learner, 1, RunRecord.of(cfg))
    optimizer = where / "optimizer.pt"
    optimizer.unlink()
    with pytest.raises(ResumeError, match=f"{where} cannot be read: .*{optimizer}"):
        load_resume(tmp_path, learner, RunRecord.of(cfg))
    weights = where / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    with pytest.raises(ResumeError, match=f"{weights} is truncated or not safetensors"):
        load_resume(tmp_path, learner, RunRecord.of(cfg))
    (where / "state.json").write_text("")
    with pytest.raises(ResumeError, match=f"{where / 'state.json'} is empty or damaged"):
        find_resume(tmp_path)


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail] No space left on device"),
    ],
)
def test_a_full_disk_while_checkpointing_says_so_and_leaves_no_resume_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    cfg = tiny_config("trainer.checkpoint_every=1")
    tokenizer = make_tokenizer(cfg)
    learner = make_learner(cfg, tokenizer)
    save_resume(tmp_path, learner, 1, RunRecord.of(cfg))
    real = learner.save_state

    def fill_the_disk(directory: Path) -> None:
        real(directory)  # most of it written, then the disk is full
        raise error

    monkeypatch.setattr(learner, "save_state", fill_the_disk)
    with pytest.raises(ResumeError, match=f"no space left on the device of {tmp_path}") as full:
        save_resume(tmp_path, learner, 2, RunRecord.of(cfg))
    assert "period 2 was not written" in str(full.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["resume"]  # no resume.tmp, the last one kept
    found = find_resume(tmp_path)
    assert found is not None and found[1]["version"] == 1


def test_a_run_folder_reused_after_a_crash_is_refused_and_never_records_a_period_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cadence dispatcher --out DIR` by hand (docs/hosts.md) on the folder of a run that crashed: its
    periods would be recorded again from period 0; refused in one line, before anything is written."""
    from cadence.cli import main
    from cadence.monitor.run_dir import RunDirError, RunRecorder

    (tmp_path / "metrics.jsonl").write_text('{"period": 0}\n{"period": 1}\n')
    with pytest.raises(RunDirError, match="holds 2 periods of an earlier run: continue it with --resume"):
        RunRecorder(tmp_path, "periodic")
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
    assert main(["dispatcher", "--config", str(config), "--out", str(tmp_path)]) == 2
    assert "holds 2 periods" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no address, no secret
    assert (tmp_path / "metrics.jsonl").read_text().count("period") == 2
    RunRecorder(tmp_path, "periodic", resume=True).finish(0.0, 2, "")  # --resume continues it
    assert json.loads((tmp_path / "summary.json").read_text())["periods"] == 2
