"""``model.compile``: ``torch.compile`` of the decoder layers (inductor), a switch because it does not always pay.

Every pass calls the layers (the full pass through the decoder, the window pass one by one), so compiling the
layers covers the rollout, the scoring and the update. Shapes change at every call (row lengths, batch sizes,
the KV cache), so the layers are compiled with dynamic shapes. What it costs (the first calls) and gives is
measured on docs/guide/speed-cpu.md; inductor keeps its compiled kernels in its own cache
(``TORCHINDUCTOR_CACHE_DIR``, by default under the system temp folder), which later runs on the machine reuse.
"""

from __future__ import annotations

import torch


def compile_layers(model: torch.nn.Module) -> None:
    """Compile each decoder layer of ``model`` in place (``nn.Module.compile``, dynamic shapes)."""
    for layer in model.get_decoder().layers:
        layer.compile(dynamic=True)
