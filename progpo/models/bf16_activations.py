"""Under CPU bf16 autocast, the norms' outputs and the rotary tables are bf16, so no activation is cast twice.

Why: autocast runs the matmuls in bf16 but leaves everything else in the dtype it receives, and two float32 tensors
feed the decoder's bf16 work:

- **the norms' outputs.** The RMSNorms return float32 (the residual stream is float32), and autocast, whose weight
  cache Lightning turns off, casts that same tensor to bf16 again in each projection that reads it: three times for
  q/k/v, twice for gate/up, in the forward and, for their gradients, in the backward. Cast once, the projections get
  the very bf16 tensor autocast would have made (the forward's numbers are unchanged); the backward adds the
  projections' input gradients in bf16 before the cast back.
- **the rotary tables.** The decoder's rotary embedding returns cos/sin in the hidden states' dtype (float32), so
  the bf16 queries and keys leave ``q * cos + rotate_half(q) * sin`` as float32 (twice the bytes through five
  elementwise passes) and the attention casts them back to bf16. With bf16 tables the rotation runs in bf16, as in
  a model held in bf16; its result is rounded three times instead of once (log-probs move within bf16 precision).

Outside a CPU bf16 autocast (float32, CUDA) the hooks return the modules' outputs as they are.
Measured on the default run (docs/guide/speed-cpu.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from progpo.models.attention import cpu_bf16_autocast

_MARK = "_progpo_bf16_activations"
_OFF: ContextVar[bool] = ContextVar("progpo_bf16_activations_off", default=False)


@contextmanager
def autocast_activations() -> Iterator[None]:
    """Inside it the hooks leave every output as autocast makes it: the path before them (``bench iteration``)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def _under_cpu_bf16(tensor: torch.Tensor) -> bool:
    return (tensor.dtype == torch.float32 and tensor.device.type == "cpu" and cpu_bf16_autocast()
            and not _OFF.get())


def _norm_output_to_bf16(module: torch.nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    return output.to(torch.bfloat16) if _under_cpu_bf16(output) else output


def _rotary_tables_to_bf16(module: torch.nn.Module, inputs, output: tuple[torch.Tensor, torch.Tensor]):
    cos, sin = output
    return (cos.to(torch.bfloat16), sin.to(torch.bfloat16)) if _under_cpu_bf16(cos) else output


def keep_activations_bf16(model: torch.nn.Module) -> None:
    """Hook every decoder layer's input and post-attention norms and the decoder's rotary embedding of ``model``
    (once; copies keep the hooks). A decoder without a shared ``rotary_emb`` keeps its rotation as it is."""
    decoder = model.get_decoder()
    hooked = [(norm, _norm_output_to_bf16) for layer in decoder.layers
              for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
    if isinstance(getattr(decoder, "rotary_emb", None), torch.nn.Module):
        hooked.append((decoder.rotary_emb, _rotary_tables_to_bf16))
    for module, hook in hooked:
        if not getattr(module, _MARK, False):
            module.register_forward_hook(hook)
            setattr(module, _MARK, True)
