"""Which vocabulary ids a constrained position allows: one definition for the sampler and the scorer.

The admissible-command trie (``progpo.rollout.engines.constrained``) masks logits while generating, and the
teacher-forced log-probs (``progpo.models.logprobs``) renormalise over the same ids, so both must build the mask
the same way. A leaf module, so that neither layer imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def allowed_mask(allowed: Sequence[Sequence[int] | None], vocab_size: int, device=None) -> torch.Tensor:
    """[N, V] bool mask: row i is True at ``allowed[i]``, everywhere when ``allowed[i]`` is None."""
    mask = torch.zeros((len(allowed), vocab_size), dtype=torch.bool)
    rows = [i for i, ids in enumerate(allowed) for _ in (ids or ())]
    cols = [j for ids in allowed for j in (ids or ())]
    if rows:
        mask[rows, cols] = True
    free = [i for i, ids in enumerate(allowed) if ids is None]
    if free:
        mask[free] = True
    return mask.to(device) if device is not None else mask
