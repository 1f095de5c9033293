"""A model's weights by their Hugging Face names: the state dict a checkpoint or a version holds, and
loading one into the model (copied, or the tensors themselves made its parameters' data).

Invariant: a tied head is never stored (``lm_head.weight`` dropped when tied to the embeddings) and
may be present or absent in what is loaded; names the model recomputes (``IGNORED_KEY_SUFFIXES``)
are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from cadence.model.transformer import Transformer

TIED_HEAD_KEY = "lm_head.weight"
EMBED_KEY = "model.embed_tokens.weight"
IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq",)  # stored by some older HF checkpoints; recomputed here


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """The HF-named state dict, without ``lm_head.weight`` when it is tied to the embeddings."""
    state = model.state_dict()
    if model.cfg.tie_embeddings:
        state.pop(TIED_HEAD_KEY, None)
    return state


def share_hf_state_dict(model: Transformer, state: Mapping[str, Tensor]) -> None:
    """The tensors of ``state`` become the data of ``model``'s parameters, uncopied: the same
    Parameter objects (a tied head follows its embedding), strict as ``load_hf_state_dict`` (a tied
    head may be present or absent); each tensor of its parameter's shape, dtype and device. A
    quarter of what ``load_state_dict(assign=True)`` takes (SmolLM2's 272 tensors: ~1 against 5 ms,
    on a version's critical path)."""
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED_KEY_SUFFIXES)}
    if model.cfg.tie_embeddings:
        state.pop(TIED_HEAD_KEY, None)
    params = dict(model.named_parameters())
    if set(state) != set(params):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ValueError(f"a state whose tensors differ: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, tensor in state.items():
        param = params[name]
        if tensor.shape != param.shape or tensor.dtype != param.dtype or tensor.device != param.device:
            raise ValueError(
                f"{name}: {tuple(tensor.shape)} {tensor.dtype} on {tensor.device} cannot be the data of "
                f"{tuple(param.shape)} {param.dtype} on {param.device}"
            )
    for name, tensor in state.items():
        params[name].data = tensor.detach()


def load_hf_state_dict(model: Transformer, state: Mapping[str, Tensor], assign: bool = False) -> None:
    """Copy ``state`` into ``model`` in place (strict); a tied head may be present or absent.

    With ``assign`` the tensors themselves become the parameters (for a model built on ``meta``).
    """
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED_KEY_SUFFIXES)}
    if model.cfg.tie_embeddings:
        state.pop(TIED_HEAD_KEY, None)
        state[TIED_HEAD_KEY] = state.get(EMBED_KEY, model.lm_head.weight)
    model.load_state_dict(state, strict=True, assign=assign)
    if assign:
        model.tie_weights()
