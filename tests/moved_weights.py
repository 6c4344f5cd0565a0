"""A checkpoint's ``state_dict`` whose every weight differs from the built model's, for tests that must tell
loaded weights from the warm start's."""

from __future__ import annotations

import torch


def moved_state_dict(module: torch.nn.Module, scale: float, prefix: str = "", seed: int = 0) -> dict[str, torch.Tensor]:
    """``module``'s state, each tensor plus ``scale`` x standard-normal noise, keys prefixed with ``prefix`` (``"actor."``
    for what Lightning saves of the ProGPO module). One draw per tensor: tied weights (embedding and lm_head) move
    together, as one tensor saved twice."""
    g = torch.Generator().manual_seed(seed)
    noise: dict[int, torch.Tensor] = {}
    state = module.state_dict()
    for v in state.values():
        if v.data_ptr() not in noise:
            noise[v.data_ptr()] = scale * torch.randn(v.shape, generator=g)
    return {f"{prefix}{k}": v.detach() + noise[v.data_ptr()] for k, v in state.items()}
