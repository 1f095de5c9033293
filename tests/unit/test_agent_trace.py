"""An agent episode's calls as token sequences (`rollout/agent/trace.py`), pure: a call that goes on
from an answer continues its sequence, a rewritten history begins another, and a branch from an
answer two calls went on from trains that answer once; every sampled id has mask 1 in exactly one
sequence, with its log-prob."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.model.hf_tokenizer import HFTokenizer
from cadence.rollout.agent.chat import Said
from cadence.rollout.agent.trace import Node, Renderer, Trace
from tests.agent_rig import byte_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """A byte-level tokenizer with ChatML's template: every text round-trips."""
    directory: Path = byte_checkpoint(tmp_path_factory.mktemp("trace") / "ckpt")
    return HFTokenizer(directory)


def answer(trace: Trace, said: list[Said], text: str, logprob: float) -> list[int]:
    """Place a call of `said`, record `text` as its answer (each id at `logprob`); the answer's ids."""
    placed = trace.place(said, None)
    ids = trace.renderer.tokenizer.encode(text)
    trace.record(placed, Said("assistant", text), ids, [logprob] * len(ids), finished=False)
    return ids


def trained(node: Node) -> list[int]:
    """The ids of `node`'s sequence with mask 1."""
    return [i for i, m in zip(node.ids[node.prompt :], node.mask, strict=True) if m]


def test_a_rewritten_history_and_a_branch_are_sequences_each_sampled_id_trained_once(
    tokenizer: HFTokenizer,
) -> None:
    trace = Trace(Renderer(tokenizer))
    ask = [Said("user", "2+2?")]
    a = answer(trace, ask, "4", -0.1)
    b = answer(trace, [*ask, Said("assistant", "4"), Said("user", "sure?")], "yes", -0.2)
    c = answer(trace, [Said("user", "someone said 4")], "ok", -0.3)  # history rewritten
    d = answer(trace, [*ask, Said("assistant", "4"), Said("user", "why?")], "sum", -0.4)  # branch from a
    first, rewritten, branch = trace.sequences()
    assert [node.said[-1].content for node in (first, rewritten, branch)] == ["yes", "ok", "sum"]
    assert first.ids[: first.prompt] == branch.ids[: branch.prompt] != rewritten.ids[: rewritten.prompt]

    assert trained(first) == a + b and trained(rewritten) == c and trained(branch) == d  # a: in first only
    for node, lps in ((first, [-0.1] * len(a) + [-0.2] * len(b)), (branch, [-0.4] * len(d))):
        assert [lp for lp, m in zip(node.logprobs, node.mask, strict=True) if m] == lps
        assert all(lp == 0.0 for lp, m in zip(node.logprobs, node.mask, strict=True) if not m)
    assert branch.ids[branch.prompt :][: len(a)] == a  # a is in the branch's context, mask 0
    assert branch.mask[: len(a)] == [0] * len(a)
    assert sum(sum(node.mask) for node in trace.sequences()) == len(a + b + c + d)
    kept = trace.kept()
    assert kept is not None and kept.said[-1].content == "yes"  # the most sampled: the transcript's


def test_a_conversation_that_goes_on_is_one_sequence(tokenizer: HFTokenizer) -> None:
    trace = Trace(Renderer(tokenizer))
    ask = [Said("user", "2+2?")]
    a = answer(trace, ask, "4", -0.1)
    b = answer(trace, [*ask, Said("assistant", "4"), Said("user", "sure?")], "yes", -0.2)
    (only,) = trace.sequences()
    assert trained(only) == a + b and only.mask.count(0) > 0  # the messages between: context
