"""A choice's log-probs in OpenAI's form: one entry a sampled id, its text what it adds to the decoded
text (a character spread over several byte tokens given whole with the last of them), its bytes."""

from __future__ import annotations

from pathlib import Path

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.logprobs import content, token_texts
from tests.agent_rig import byte_checkpoint


def test_each_token_is_its_text_and_a_split_character_comes_whole_with_its_last_byte(tmp_path: Path) -> None:
    tokenizer = HFTokenizer(byte_checkpoint(tmp_path / "ckpt"))
    ids = tokenizer.encode("aé€!") + [tokenizer.eos_id]  # é: 2 bytes, €: 3, one token a byte
    assert len(ids) == 1 + 2 + 3 + 1 + 1
    assert token_texts(tokenizer, ids) == ["a", "", "é", "", "", "€", "!", "<|im_end|>"]
    entries = content(tokenizer, ids, [-float(i) for i in range(len(ids))])
    assert [e["logprob"] for e in entries] == [-float(i) for i in range(len(ids))]
    assert entries[2]["bytes"] == list("é".encode()) and entries[1]["bytes"] == []
    assert all(e["top_logprobs"] == [] for e in entries)


def test_a_character_cut_short_at_the_end_is_shown_as_decoded(tmp_path: Path) -> None:
    tokenizer = HFTokenizer(byte_checkpoint(tmp_path / "ckpt"))
    ids = tokenizer.encode("é")[:1]
    assert token_texts(tokenizer, ids) == [tokenizer.decode(ids, skip_special=False)]
    assert token_texts(tokenizer, []) == []
