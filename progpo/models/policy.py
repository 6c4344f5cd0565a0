"""The frozen reference policy (the KL anchor) of a :class:`~progpo.types.Policy`."""

from __future__ import annotations

import copy

import torch

from progpo.types import Policy


def make_reference(policy: Policy) -> torch.nn.Module:
    """Frozen copy of the policy's current weights (the KL anchor): eval mode, no gradients."""
    reference = copy.deepcopy(policy.model)
    reference.eval()
    reference.requires_grad_(False)
    return reference
