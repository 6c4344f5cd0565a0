"""Under CPU bf16 autocast, each decoder layer's RMSNorm output is cast to bf16 once, not once per projection.

Why: the norms return float32 (the residual stream is float32), and autocast, whose weight cache Lightning turns
off, casts that same tensor to bf16 again in each projection that reads it: three times for q/k/v, twice for
gate/up, in the forward and, for their gradients, in the backward. Cast once, the projections get the very bf16
tensor autocast would have made (the forward's numbers are unchanged); the backward adds the projections' input
gradients in bf16 before the cast back. On the default run's bf16 update: 12.1 -> 11.5 s (docs/guide/speed-cpu.md).
Outside a CPU bf16 autocast (float32, CUDA) the hook returns the norm's output as it is.
"""

from __future__ import annotations

import torch

from progpo.models.attention import cpu_bf16_autocast

_MARK = "_progpo_norm_cast"


def _to_bf16_under_cpu_autocast(module: torch.nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    if output.dtype == torch.float32 and output.device.type == "cpu" and cpu_bf16_autocast():
        return output.to(torch.bfloat16)
    return output


def cast_norm_outputs(model: torch.nn.Module) -> None:
    """Hook the input and post-attention norms of every decoder layer of ``model`` (once; copies keep the hooks)."""
    for layer in model.get_decoder().layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not getattr(norm, _MARK, False):
                norm.register_forward_hook(_to_bf16_under_cpu_autocast)
                setattr(norm, _MARK, True)
