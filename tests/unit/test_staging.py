"""The next version staged: the parameters moved into its buffer, the step taken there, the publish
copying nothing; a buffer handed out never changes after."""

from __future__ import annotations

import dataclasses
import mmap
from collections.abc import Callable

import pytest
import torch

from cadence.model.checkpoint import state_dict_from_bytes
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.training.learner import TorchLearner, TrainGroup
from tests.unit.test_prefix import CONFIGS, make_groups

REWARDS = [[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.8]]


def learner(tied: bool = True, weight_decay: float = 0.1, precision: str = "fp32") -> TorchLearner:
    cfg = dataclasses.replace(CONFIGS["llama"], tie_embeddings=tied)
    return TorchLearner(
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-2,
        weight_decay,
        0.2,
        0.28,
        0.0,
        1.0,
        precision=precision,
    )


def train_and_step(learner: TorchLearner, turn: int) -> None:
    groups = [TrainGroup(p, c, r) for (p, c), r in zip(make_groups(turn), REWARDS, strict=True)]
    learner.train_groups(groups[turn % 2 :])
    learner.step(4.0)


def slots() -> tuple[list[mmap.mmap], Callable[[int], mmap.mmap]]:
    made: list[mmap.mmap] = []

    def alloc(nbytes: int) -> mmap.mmap:
        made.append(mmap.mmap(-1, nbytes))
        return made[-1]

    return made, alloc


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_a_staged_step_publishes_the_very_bytes_an_unstaged_one_serialises(
    tied: bool, weight_decay: float
) -> None:
    staged, plain = learner(tied, weight_decay), learner(tied, weight_decay)
    made, alloc = slots()
    for turn in range(3):
        assert staged.stage(alloc) is None
        train_and_step(staged, turn)
        train_and_step(plain, turn)
        version = staged.weights(alloc)
        assert version is made[-1]  # the staged buffer itself: nothing serialised at the publish
        assert bytes(version) == bytes(plain.weights())
    assert len(made) == 3 and staged.versions.moves == 0
    first = next(iter(staged.model.parameters()))
    base = torch.frombuffer(made[-1], dtype=torch.uint8).data_ptr()
    assert base <= first.data_ptr() < base + len(made[-1])  # the parameters live in the last version


def test_a_buffer_handed_out_never_changes_when_the_learner_steps_or_loads_again() -> None:
    staged, plain = learner(), learner()
    _, alloc = slots()
    staged.stage(alloc)
    train_and_step(staged, 0)
    train_and_step(plain, 0)
    handed = staged.weights(alloc)
    kept = bytes(handed)
    train_and_step(staged, 1)  # nothing staged: the parameters leave the handed buffer first
    train_and_step(plain, 1)
    assert bytes(handed) == kept and staged.versions.moves == 1
    assert bytes(staged.weights()) == bytes(plain.weights())  # a serialisation, as without staging
    staged.stage(alloc)
    again = staged.weights(alloc)
    staged.load(state_dict_from_bytes(bytes(learner().weights())), staged.optimizer_state())
    assert bytes(handed) == kept and bytes(again) == bytes(plain.weights())
    assert bytes(staged.weights()) == bytes(learner().weights())


def test_the_staged_buffer_is_handed_out_once_and_only_for_its_dtype() -> None:
    staged = learner()
    _, alloc = slots()
    staged.stage(alloc, "float32")
    own, take = slots()
    assert staged.versions.take(None) is None and staged.versions.take("bfloat16") is None
    first = staged.weights(take, "float32")
    assert first is not None and not own
    second = staged.weights(take, "float32")
    assert second is own[-1] and bytes(second) == bytes(first)


def test_nothing_is_staged_where_the_bytes_would_not_be_the_parameters() -> None:
    made, alloc = slots()
    assert "published in torch.bfloat16" in (learner().stage(alloc, "bfloat16") or "")
    assert not made
    bf16 = learner(precision="bf16")  # float32 parameters under autocast: staged like any
    assert bf16.stage(alloc) is None
