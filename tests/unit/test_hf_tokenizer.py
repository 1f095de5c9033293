"""The checkpoint tokenizer against transformers' own reading of the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from cadence.model.engine import prompt_trunk
from cadence.model.hf_tokenizer import HFTokenizer
from cadence.model.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")

TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_checkpoint_tokenizer(directory: Path, template_in_config: bool) -> Path:
    words = [
        "what",
        "is",
        "the",
        "sum",
        "of",
        "and",
        "?",
        "answer",
        "with",
        "number",
        "only",
        "be",
        "brief",
        "system",
        "user",
        "assistant",
    ]
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "\n": 3}
    for ch in "0123456789+=?.,":
        vocab.setdefault(ch, len(vocab))
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)]
    )
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }
    if template_in_config:
        config["chat_template"] = TEMPLATE
    else:
        (directory / "chat_template.jinja").write_text(TEMPLATE)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("template_in_config", [False, True])
def test_prompt_ids_equal_transformers_chat_template(tmp_path: Path, template_in_config: bool) -> None:
    directory = make_checkpoint_tokenizer(tmp_path / "tok", template_in_config)
    ours = HFTokenizer(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    text = "what is the sum of 12 and 30 ? answer with number only"
    expected = theirs.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert ours.encode_prompt(text) == list(expected)
    assert (ours.eos_id, ours.bos_id, ours.pad_id) == (2, 1, 2)
    assert ours.vocab_size == len(theirs)
    assert ours.encode("12 + 30") == theirs.encode("12 + 30", add_special_tokens=False)


def test_decode_response_drops_one_trailing_eos_and_shows_other_specials(tmp_path: Path) -> None:
    tok = HFTokenizer(make_checkpoint_tokenizer(tmp_path / "tok", False))
    ids = tok.encode("42")
    assert tok.decode_response([*ids, tok.eos_id]) == tok.decode(ids, skip_special=False)
    assert "<|im_start|>" in tok.decode_response([tok.bos_id, *ids, tok.eos_id])
    assert set(tok.files()) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def test_a_config_without_an_eos_token_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint_tokenizer(tmp_path / "tok", False)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="eos_token"):
        HFTokenizer(directory)


def test_the_prompt_trunk_is_what_the_template_puts_before_every_text(tmp_path: Path) -> None:
    tok = HFTokenizer(make_checkpoint_tokenizer(tmp_path / "tok", False))
    trunk = prompt_trunk(tok)
    prompts = [tok.encode_prompt(text) for text in ("what is 12 + 30 ?", "7", "no")]
    assert len(trunk) >= 5 and all(p[: len(trunk)] == trunk for p in prompts)
    assert len({p[len(trunk)] for p in prompts}) == 3  # where the texts begin
    assert prompt_trunk(CharTokenizer()) == [CharTokenizer().encode("", bos=True)[0]]  # its bos alone
