"""Rotary position embeddings on a CPU in two passes over the queries and keys instead of five.

Why: transformers applies the rotation as ``q * cos + rotate_half(q) * sin``, where ``rotate_half`` negates one
half and concatenates: a negation, a concatenation, two products and a sum, each an eager pass over [B, heads, L,
head_dim], forward and backward. On the tiny model's bf16 update these elementwise passes cost more than the
attention's matmuls (torch's profiler: 7% of a learn in the rotation's products alone). Written on the two halves,
``x1 * cos1 - x2 * sin1`` and ``x2 * cos2 + x1 * sin2``, each half is one product and one fused multiply-add into
the output; the backward is the same rotation with the sine negated and the halves' roles swapped.

The values are the definition's up to rounding: the fused multiply-add rounds ``x1 * cos1 - x2 * sin1`` once where
the definition rounds the product first, so float32 results differ from transformers' by at most one ulp and bf16
ones are rounded twice instead of three times, no further from the exact rotation in either (``tests/models/
test_rotary.py``). Any cos/sin tables work (the halves are not assumed equal). CUDA tensors keep transformers'
function. ``transformers_rotary()`` turns it off (the bench's paths before).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from progpo.models.window import SUPPORTED_MODEL_TYPES

_MARK = "_progpo_original_rotary"
_OFF: ContextVar[bool] = ContextVar("progpo_transformers_rotary", default=False)


@contextmanager
def transformers_rotary() -> Iterator[None]:
    """Inside it the decoders apply transformers' own rotation (the path before this module: ``bench iteration``)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, transpose: bool = False) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` (``transpose``: its adjoint, ``x * cos + rotate_half^T(x * sin)``, the
    gradient of the rotation), in the layout of ``x`` and the dtype torch promotes ``x`` and ``cos`` to."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos1, cos2, sin1, sin2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
    out = torch.empty_like(x, dtype=torch.result_type(x, cos))
    out1, out2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos1, out=out1)
    torch.mul(x2, cos2, out=out2)
    if transpose:  # [g1 c1 + g2 s2, g2 c2 - g1 s1]
        out1.addcmul_(x2, sin2)
        out2.addcmul_(x1, sin1, value=-1)
    else:  # [x1 c1 - x2 s1, x2 c2 + x1 s2]
        out1.addcmul_(x2, sin1, value=-1)
        out2.addcmul_(x1, sin2)
    return out


class _Rotation(torch.autograd.Function):
    """The rotation with its adjoint as backward (the tables are constants: no gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.input_dtype = x.dtype
        return rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return rotate(grad, cos, sin, transpose=True).to(ctx.input_dtype), None, None


def _rotation(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotation.apply(x, cos, sin)
    return rotate(x, cos, sin)


def _two_pass(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1):
        if q.device.type != "cpu" or _OFF.get():
            return original(q, k, cos, sin, unsqueeze_dim)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _rotation(q, cos, sin), _rotation(k, cos, sin)

    apply_rotary_pos_emb.__doc__ = f"{__name__}: transformers' ``apply_rotary_pos_emb`` in two passes on a CPU."
    setattr(apply_rotary_pos_emb, _MARK, original)
    return apply_rotary_pos_emb


def use_two_pass_rotary(model: torch.nn.Module) -> bool:
    """Give the decoder's modeling module (Qwen2, Llama: whose attention calls its module's ``apply_rotary_pos_emb``)
    the two-pass rotation; False (nothing changed) for another decoder. Idempotent; the module's other models get it
    too, on CPU tensors only, with the same values up to one rounding (module docstring)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:  # their attention calls it
        return False
    module = sys.modules[type(model.get_decoder().layers[0].self_attn).__module__]
    current = getattr(module, "apply_rotary_pos_emb", None)
    if current is None:
        return False
    if not hasattr(current, _MARK):
        module.apply_rotary_pos_emb = _two_pass(current)
    return True
