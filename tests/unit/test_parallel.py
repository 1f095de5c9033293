"""Data-parallel training on 2 gloo ranks, whole or sharded (FSDP2), equals 1 rank; a follower whose rank 0
dies fails naming itself."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import msgpack
import pytest
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from cadence.config import ConfigError, TrainerConfig
from cadence.launch.processes import end_rank
from cadence.launch.torchrun import free_port
from cadence.model.checkpoint import state_dict_to_bytes
from cadence.model.tokenizer import CharTokenizer
from cadence.model.transformer import init_model
from cadence.training.collectives import CollectiveError, Collectives, local_device
from cadence.training.learner import TorchLearner, TrainGroup
from cadence.training.parallel import DistributedLearner, follow, share
from cadence.training.ranks import Ranks, ranks_from_env
from cadence.training.sharding import ShardedLearner
from cadence.training.train_group import sampled_tokens
from tests.conftest import tiny_config
from tests.unit.test_learner import REWARDS, learner
from tests.unit.test_lora import lora_learner
from tests.unit.test_prefix import CONFIGS, make_groups

pytestmark = pytest.mark.timeout(180)
TIMEOUT_S = 4.0  # the collectives' limit; rank 0 idles longer than it once (the followers are pinged)


def groups() -> list[TrainGroup]:
    """Unequal groups (4, 4, 3 and 4 completions), a 1-completion one, one with the sampler's log-probs
    and environment tokens (each completion's mask its own); every prompt begins with the same tokens
    (the trunk a step's micro-batches share)."""
    system = [3, 1, 4, 1, 5]
    base = [TrainGroup(system + p, c, r) for (p, c), r in zip(make_groups(3), REWARDS, strict=True)]
    single = TrainGroup([*system, 4, 5, 6], [[7, 8]], [1.0])
    prompt, completions = make_groups(8)[0]
    masks = [[int(t == 0 or t % 3 != i % 3) for t in range(len(c))] for i, c in enumerate(completions)]
    old = [[-1.5 - 0.1 * i if sampled else 0.0 for sampled in m] for i, m in enumerate(masks)]
    sampled = TrainGroup(system + prompt, completions, [0.0, 1.0, 1.0, 0.5], old, masks=masks)
    return [*base, single, sampled]


def schedule() -> list[list[list[TrainGroup]]]:
    """Steps, each a list of micro-batches: an odd count of groups, a step rank 1 has no share of,
    sampler log-probs and a 1-completion group next to a big one."""
    g = groups()
    return [[[g[0], g[1], g[2]], [g[3]]], [[g[4]]], [[g[2]], [g[5], g[4]], [g[0]]]]


def normaliser(step: list[list[TrainGroup]]) -> float:
    return float(sum(sampled_tokens([group for batch in step for group in batch])))


def drive(trainer: TorchLearner | DistributedLearner, save: Path, idle: float = 0.0) -> None:
    """The schedule; the last step goes from step 0's resume checkpoint (on 2 ranks the follower gets
    rank 0's loaded state); then a step without any gradient, which must leave every weight alone."""
    steps = schedule()
    for i, step in enumerate(steps):
        if i == len(steps) - 1:
            trainer.load_state(save)
        for batch in step:
            trainer.train_groups(batch)
        trainer.step(normaliser(step))
        if i == 0:
            trainer.save_state(save)
            time.sleep(idle)
    trainer.step(1.0)


def resume_last_step(trainer: TorchLearner | DistributedLearner, save: Path) -> None:
    """A fresh trainer continues from `save` (step 0's checkpoint) with the schedule's last step."""
    trainer.load_state(save)
    last = schedule()[-1]
    for batch in last:
        trainer.train_groups(batch)
    trainer.step(normaliser(last))


def _learner(comm: Collectives, sharding: str) -> TorchLearner:
    """`learner("shared_prompt")` of test_learner, whole or sharded over `comm`."""
    if sharding == "none":
        return learner("shared_prompt")
    if sharding == "lora":  # whole on every rank, adapters trained (trainer.lora)
        return lora_learner()
    cfg = CONFIGS["qwen3"]
    recompute = sharding == "fsdp2-recompute"  # each block computed again inside FSDP2's gathers
    return ShardedLearner(
        comm,
        init_model(cfg, seed=5),
        cfg,
        CharTokenizer(),
        1e-3,
        0.0,
        0.2,
        0.28,
        0.1,
        1.0,
        recompute=recompute,
    )


def _held(local: TorchLearner) -> dict[str, int]:
    """Elements of the policy and of AdamW's moments this rank holds, and those of the whole model."""
    params = list(local.model.parameters())
    moments = [t for entry in local.optimizer.state.values() for k, t in entry.items() if k != "step"]
    return {
        "held": sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in params + moments),
        "whole": 3 * sum(p.numel() for p in params),
    }


def _rank(rank: int, port: int, out: str, scenario: str, sharding: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ranks = Ranks(rank, 2, 0)
    comm = Collectives(TrainerConfig(collective_timeout_s=TIMEOUT_S), ranks, torch.device("cpu"))
    try:
        local = _learner(comm, sharding)
        if rank > 0:
            follow(local, comm)
            if sharding == "none":
                Path(out, f"rank{rank}.safetensors").write_bytes(state_dict_to_bytes(local.model))
            Path(out, f"rank{rank}.json").write_text(json.dumps(_held(local)))
            return
        leader = DistributedLearner(local, comm)
        if scenario == "die":
            leader.train_groups(groups()[:2])
            os._exit(3)  # no "stop": the follower must notice on its own
        if scenario == "resume":
            resume_last_step(leader, Path(out, "resume-one"))
        else:
            drive(leader, Path(out, "resume"), idle=TIMEOUT_S + 1.0)
        Path(out, "rank0.safetensors").write_bytes(leader.weights())
        Path(out, "rank0.json").write_text(json.dumps(_held(local)))
        leader.close()
    except CollectiveError as err:
        Path(out, f"rank{rank}.error").write_text(str(err))
        raise SystemExit(1) from None
    finally:  # as `follower_main` does: a group left to the interpreter's exit may abort it
        comm.close()


def _rank_process(rank: int, port: int, out: str, scenario: str, sharding: str) -> None:
    """`_rank` ended as a trainer rank's process ends (`processes.end_rank`): its status and output
    kept, without the interpreter's teardown, in which gloo's threads may abort a process whose group
    was destroyed ("terminate called without an active exception") after every check has passed."""
    status = 0
    try:
        _rank(rank, port, out, scenario, sharding)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    end_rank(status)


def _spawn(out: Path, scenario: str = "drive", sharding: str = "none") -> list[int | None]:
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_process, args=(r, port, str(out), scenario, sharding)) for r in range(2)
    ]
    for p in procs:
        p.start()
    deadline = time.time() + 120
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def test_the_share_of_every_rank_covers_each_completion_once_with_the_group_advantages() -> None:
    g = groups()
    parts = [share(g, rank, 2) for rank in range(2)]
    assert [len(part) for part in parts] == [6, 5]  # the 1-completion group is rank 0's alone
    for group in g:
        assert sorted(
            c for part in parts for s in part if s.prompt == group.prompt for c in s.completions
        ) == sorted(group.completions)
        assert group.advantages is None
    # advantages stay those of the whole group: rank 1's share of group 1 has rewards [0, 1]
    assert parts[1][1].rewards == [0.0, 1.0] and parts[1][1].advantages == pytest.approx([-1.0, 1.0])
    # dr_grpo's advantages are not divided by the group's std: r - mean of the whole group, 0 and 1
    unscaled = [share(g, rank, 2, scale=False) for rank in range(2)]
    assert unscaled[1][1].advantages == pytest.approx([-0.5, 0.5])


def test_a_share_keeps_each_completion_with_its_mask_and_crosses_as_msgpack() -> None:
    """A completion goes to its rank with its own old log-probs and mask; the share, sent as rank 0's
    "train" command sends it, arrives whole."""
    masked = groups()[-1]
    assert masked.masks is not None and masked.old_logprobs is not None
    assert len({tuple(m) for m in masked.masks}) > 1  # the masks differ: a shift would show
    for rank in range(2):
        (part,) = share([masked], rank, 2)
        index = range(rank, len(masked.completions), 2)
        assert part.completions == [masked.completions[i] for i in index]
        assert part.masks == [masked.masks[i] for i in index]
        assert part.old_logprobs == [masked.old_logprobs[i] for i in index]
        assert TrainGroup(**msgpack.unpackb(msgpack.packb(dataclasses.asdict(part)))) == part
    assert sum(sampled_tokens(share([masked], 0, 2) + share([masked], 1, 2))) == sum(sampled_tokens([masked]))


@pytest.mark.parametrize("sharding", ["none", "fsdp2", "fsdp2-recompute"])
def test_two_ranks_train_like_one(tmp_path: Path, sharding: str) -> None:
    assert _spawn(tmp_path, sharding=sharding) == [0, 0], [p.read_text() for p in tmp_path.glob("*.error")]
    one = learner("shared_prompt")
    drive(one, tmp_path / "resume-one")
    expected = load_file(str(tmp_path / "rank0.safetensors"))  # rank 0's weights, as published
    single = load_bytes(bytes(one.weights()))
    start = load_bytes(bytes(learner("shared_prompt").weights()))
    assert max(float((single[k] - start[k]).abs().max()) for k in single) > 1e-3  # the steps moved them
    assert max(float((expected[k] - single[k]).abs().max()) for k in single) <= 1e-5
    held = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if sharding == "none":
        follower = load_file(str(tmp_path / "rank1.safetensors"))
        assert all(torch.equal(expected[k], follower[k]) for k in expected)  # ranks stay identical
        assert all(h["held"] == h["whole"] for h in held)
        return
    # each rank holds about half of the weights and moments, together all of them
    assert sum(h["held"] for h in held) == held[0]["whole"] and all(
        h["held"] < 0.6 * h["whole"] for h in held
    )
    # the 2-rank checkpoint resumes on 1 rank (one layout for both), and a fresh 2-rank trainer resumes
    # from the 1-rank one: both end with the weights of the uninterrupted 1-rank run
    resumed = learner("shared_prompt")
    resume_last_step(resumed, tmp_path / "resume")
    resumed.step(1.0)
    assert (
        max(float((load_bytes(bytes(resumed.weights()))[k] - single[k]).abs().max()) for k in single) <= 1e-5
    )
    assert _spawn(tmp_path, "resume", sharding) == [0, 0], [p.read_text() for p in tmp_path.glob("*.error")]
    fresh = load_file(str(tmp_path / "rank0.safetensors"))
    assert max(float((fresh[k] - single[k]).abs().max()) for k in single) <= 1e-5


def test_a_follower_fails_naming_itself_when_rank_0_dies(tmp_path: Path) -> None:
    begin = time.time()
    codes = _spawn(tmp_path, "die")
    assert codes == [3, 1]
    error = (tmp_path / "rank1.error").read_text()
    assert "trainer rank 1 of 2" in error and "rank 0's next command" in error
    assert time.time() - begin < 60


def test_the_ranks_come_from_torchrun_and_must_match_the_config() -> None:
    two = TrainerConfig(ranks=2)
    assert ranks_from_env(two, {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}) == Ranks(1, 2, 1)
    assert ranks_from_env(TrainerConfig(), {}) == Ranks(0, 1, 0)
    with pytest.raises(ConfigError, match=r"trainer.ranks = 2 wants the trainer started by torchrun"):
        ranks_from_env(two, {})
    with pytest.raises(
        ConfigError, match=r"torchrun started 4 processes \(WORLD_SIZE\); set trainer.ranks = 4"
    ):
        ranks_from_env(two, {"WORLD_SIZE": "4", "RANK": "0"})
    assert Ranks(0, 2).name == "trainer" and Ranks(1, 2).name == "trainer.rank1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.ranks=0", "trainer.ranks must be >= 1"),
        ("trainer.device='tpu'", "trainer.device = 'tpu' is not allowed"),
        ("trainer.collective_timeout_s=0", "trainer.collective_timeout_s must be positive"),
        ("trainer.sharding='fsdp'", "trainer.sharding = 'fsdp' is not allowed"),
        ("trainer.sharding='fsdp2'", r"trainer.sharding = 'fsdp2' needs trainer.ranks > 1 \(got 1\)"),
    ],
)
def test_bad_trainer_rank_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(override)
    with pytest.raises(ConfigError, match="trainer.ranks = 2 needs trainer.learner = 'torch'"):
        tiny_config("trainer.ranks=2", "trainer.learner='simulated'")
    with pytest.raises(
        ConfigError, match="trainer.sharding = 'fsdp2' needs trainer.packing = 'shared_prompt'"
    ):
        tiny_config("trainer.ranks=2", "trainer.sharding='fsdp2'", "trainer.packing='padded'")
    assert tiny_config("trainer.ranks=2", "trainer.sharding='fsdp2'").trainer.sharding == "fsdp2"


def test_a_device_torch_cannot_reach_is_named() -> None:
    with pytest.raises(ConfigError, match="trainer.device = 'npu' needs torch_npu"):
        local_device(TrainerConfig(device="npu"), Ranks())
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="trainer.device = 'cuda': rank 0 wants device 0"):
            local_device(TrainerConfig(device="cuda"), Ranks())


def test_a_rollout_device_torch_cannot_reach_is_named() -> None:
    from cadence.model.devices import open_device

    assert open_device("cpu", 0, "rollout.device", "a rollout worker") == torch.device("cpu")
    with pytest.raises(ConfigError, match="rollout.device = 'npu' needs torch_npu"):
        open_device("npu", 0, "rollout.device", "a rollout worker")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="rollout.device = 'cuda': a rollout worker wants device 0"):
            open_device("cuda", 0, "rollout.device", "a rollout worker")
    with pytest.raises(ConfigError, match="rollout.device = 'cuda' is the built-in engine's"):
        tiny_config("rollout.engine='vllm'", "rollout.device='cuda'")


def test_two_ranks_train_adapters_like_one(tmp_path: Path) -> None:
    """With adapters the ranks sum the adapters' gradients alone and publish the same adapters."""
    assert _spawn(tmp_path, sharding="lora") == [0, 0], [p.read_text() for p in tmp_path.glob("*.error")]
    one = lora_learner()
    drive(one, tmp_path / "resume-one")
    expected = load_file(str(tmp_path / "rank0.safetensors"))  # rank 0's adapters, as published
    single = {k: t.detach() for k, t in one.tensors().items()}
    start = {k: t.detach() for k, t in lora_learner().tensors().items()}
    assert expected.keys() == single.keys()
    assert max(float((single[k] - start[k]).abs().max()) for k in single) > 1e-3  # the steps moved them
    assert max(float((expected[k] - single[k]).abs().max()) for k in single) <= 1e-5
