"""Batches offered to a running call: taken whole and in order, as room allows; what was never taken
comes back once the call has returned, and nothing is taken after."""

from __future__ import annotations

from cadence.model.tokenizer import CharTokenizer
from cadence.rollout.joining import Joining
from cadence.tasks.base import Prompt

TOKENIZER = CharTokenizer("0123456789+=")


def _batch(*texts: str) -> list[tuple[str, Prompt, list[int]]]:
    return [(text, Prompt(i, text, ""), [i, i + 1]) for i, text in enumerate(texts)]


def test_batches_are_taken_whole_in_order_while_their_prompts_fit() -> None:
    joining: Joining[str] = Joining(TOKENIZER)
    assert joining.take(100) == []
    assert joining.offer(_batch("1+1=", "22+2="))
    assert joining.offer(_batch("3333333333+3="))  # too long for a room of 10: it and all after wait
    assert joining.offer(_batch("4="))
    short = len(TOKENIZER.encode_prompt("22+2="))
    got = joining.take(short)
    assert got == [(TOKENIZER.encode_prompt("1+1="), [0, 1]), (TOKENIZER.encode_prompt("22+2="), [1, 2])]
    assert joining.take(short) == []  # the long one is next: nothing skips it
    assert [j.tag for j in joining.taken] == ["1+1=", "22+2="]
    left = joining.close()
    assert [[j.tag for j in batch] for batch in left] == [["3333333333+3="], ["4="]]
    assert joining.take(1000) == [] and joining.close() == []  # returned once; nothing after the call
    assert not joining.offer(_batch("5="))  # refused once the call has returned
    assert [j.tag for j in joining.taken] == ["1+1=", "22+2="]
