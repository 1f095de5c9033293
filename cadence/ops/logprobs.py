"""Per-token log-probabilities of given tokens under a model's logits, at the sampling temperature.

Invariant: `token_logprobs(logits, targets, T)[b, t]` is log softmax(logits[b, t] / T)[targets[b, t]],
computed in float32 whatever the logits' dtype: the distribution the engine samples from (before
top-p, whose truncation is never renormalised into a log-prob). T = 0 (greedy) and T = 1 leave the
logits as they are, so a greedy run's log-probs are those at T = 1 and T = 1 is bit for bit the
untempered computation.

`head_logprobs` reads the same log-probs from the final hidden states [N, H] and the head, a chunk of
`chunk` tokens at a time: a chunk's logits [chunk, V] are made, read and freed, and made again in the
backward (`torch.utils.checkpoint`), so the [N, V] logits never exist whole; with N <= `chunk` it is
the whole computation itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

LOGPROB_CHUNK = 1024  # tokens a chunk: SmolLM2's logits of a chunk are 1024 x 49152 floats, 200 MB


def tempered(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 `logits / temperature`; the logits themselves at temperature 0 (greedy) or 1."""
    logits = logits.float()
    return logits if temperature in (0.0, 1.0) else logits / temperature


def token_logprobs(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, entropy: list[Tensor] | None = None
) -> Tensor:
    """Log-probability of each target token: logits [..., V], targets [...] -> [...]. With `entropy`,
    the (detached) entropy of each row's tempered distribution is appended to it, from the same
    softmax: no second forward."""
    logits = tempered(logits.float(), temperature)  # a bf16 forward's logits: the softmax in float32
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    norm = torch.logsumexp(logits, dim=-1)
    if entropy is not None:
        with torch.no_grad():
            probs = (logits - norm.unsqueeze(-1)).exp_()  # the softmax, from the normaliser at hand
            entropy.append(norm - torch.linalg.vecdot(probs, logits))  # H = logsumexp - Σ p z
    return picked - norm


def _chunk_logprobs(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float, spread: bool
) -> tuple[Tensor, Tensor | None]:
    """One chunk: the head's float32 logits, their log-probs at `targets` and (with `spread`) entropies."""
    entropy: list[Tensor] | None = [] if spread else None
    logp = token_logprobs(F.linear(hidden, weight, bias).float(), targets, temperature, entropy)
    return logp, entropy[0] if entropy else None


def head_logprobs(
    hidden: Tensor,
    head: nn.Linear,
    targets: Tensor,
    temperature: float = 1.0,
    entropy: list[Tensor] | None = None,
    chunk: int = LOGPROB_CHUNK,
) -> Tensor:
    """`token_logprobs(head(hidden).float(), targets, temperature, entropy)` for hidden [N, H] and
    targets [N], `chunk` tokens at a time; a chunk's logits are recomputed in the backward, never kept."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    weight, bias = head.weight, head.bias  # the tensors of this forward (a sharded head's gathered ones)
    spread = entropy is not None
    n = hidden.shape[0]
    recompute = n > chunk and torch.is_grad_enabled()  # a chunk's graph would keep its logits
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, max(n, 1), chunk):
        args = (
            hidden[start : start + chunk],
            weight,
            bias,
            targets[start : start + chunk],
            temperature,
            spread,
        )
        if recompute:
            logp, part = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, part = _chunk_logprobs(*args)
        logps.append(logp)
        if part is not None:
            entropies.append(part)
    if entropy is not None:
        entropy.append(entropies[0] if len(entropies) == 1 else torch.cat(entropies))
    return logps[0] if len(logps) == 1 else torch.cat(logps)


def logprob_reader(
    targets: Tensor, temperature: float = 1.0, entropy: list[Tensor] | None = None, chunk: int = LOGPROB_CHUNK
) -> Callable[[Tensor, nn.Linear], Tensor]:
    """A model's `head` argument (model/transformer.py): its final hidden states at the read positions
    and its head -> `head_logprobs` at `targets`, in place of the logits."""

    def read(hidden: Tensor, head: nn.Linear) -> Tensor:
        return head_logprobs(hidden, head, targets, temperature, entropy, chunk)

    return read
