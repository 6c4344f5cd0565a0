"""Scoring and update batches padded to a few shapes on an AMX-BF16 CPU, so that oneDNN re-uses its matmul kernels.

Why: torch runs a CPU's bf16 matmuls through oneDNN, which builds a kernel (a primitive) for each new shape and
caches it. With AMX a build takes ~5 ms, against ~0.7 ms to run a [3,000 x 256] x [256 x 688] product once built,
and scoring and update micro-batches bring a new row count and length at almost every call: one default learn
(scoring and update of an ALFWorld batch) built ~1,600 kernels in 3.5 s against 1.9 s running matmuls. Padded to
rows of a multiple of ``ROW_MULTIPLE``, lengths of a multiple of ``LENGTH_MULTIPLE``, response windows of a multiple
of ``WINDOW_MULTIPLE`` and LM-head rows of a multiple of ``HEAD_ROW_MULTIPLE``, a learn meets a few dozen shapes,
which ``progpo/__init__.py``'s larger kernel cache on these CPUs keeps for the whole run (one learn: ~10 kernels
built once the run has seen its shapes, 1.25-1.37x faster; ``docs/guide/speed-cpu.md``).

What the padding computes is discarded: extra rows repeat the batch's last row and are sliced off, extra positions
sit after each row's last token, where a causal model's real positions never look, and padded LM-head rows are
sliced off before the loss. The values at real positions are those of the unpadded batch up to the order of the
matmuls' sums. Elsewhere (float32, CUDA, CPUs whose kernels build fast) the batches run as they come.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from progpo.hardware import cpu_has_amx
from progpo.models.attention import cpu_bf16_autocast

# Rows: a multiple of 8 from 8 rows up (micro-batches of 32 steps hold 27-32 distinct turns: 32 rows); a batch of
# fewer rows keeps its count (at most 7 shapes, and padding SmolLM2's micro-batches of 4 to 8 doubled its update).
ROW_MULTIPLE = 8
LENGTH_MULTIPLE = 16  # sequences of ~100-400 tokens: at most 15 padded positions, ~5% on average
WINDOW_MULTIPLE = 4  # response windows of 1-30 tokens (the last layer's rows, progpo.models.window)
HEAD_ROW_MULTIPLE = 16  # the LM head's rows: every response token of the micro-batch

# Where batches are padded under CPU bf16 autocast (module docstring); tests set it to check both ways.
PAD_SHAPES = cpu_has_amx()


def padding_active(device: torch.device) -> bool:
    """Whether this pass pads its batch: on a CPU under bf16 autocast where ``PAD_SHAPES`` is on."""
    return PAD_SHAPES and device.type == "cpu" and cpu_bf16_autocast()


@contextmanager
def batches_as_they_come() -> Iterator[None]:
    """No padding inside this block (the bench's paths before this change)."""
    global PAD_SHAPES
    kept, PAD_SHAPES = PAD_SHAPES, False
    try:
        yield
    finally:
        PAD_SHAPES = kept


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple


def pad_batch(input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
              allowed: Sequence[Sequence[Sequence[int]] | None] | None
              ) -> tuple[Tensor, Tensor, Tensor, list | None]:
    """A right-padded [B, L] batch as [round_up(B, ROW_MULTIPLE) (B below ROW_MULTIPLE: B), round_up(L,
    LENGTH_MULTIPLE)]: new columns are padding (token 0, outside both masks), new rows copies of the last row (and of
    its allowed ids)."""
    rows, length = input_ids.shape
    extra_rows = round_up(rows, ROW_MULTIPLE) - rows if rows > ROW_MULTIPLE else 0
    extra_columns = round_up(length, LENGTH_MULTIPLE) - length
    tensors = []
    for tensor in (input_ids, attention_mask, response_mask):
        tensor = F.pad(tensor, (0, extra_columns))
        tensors.append(torch.cat([tensor, tensor[-1:].expand(extra_rows, -1)]) if extra_rows else tensor)
    if allowed is not None and extra_rows:
        allowed = [*allowed, *([allowed[-1]] * extra_rows)]
    return tensors[0], tensors[1], tensors[2], (list(allowed) if allowed is not None else None)


def pad_head_rows(hidden: Tensor, targets: Tensor, allowed: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The LM head's inputs [N, d], targets [N] and allowed-id mask [N, V] with N rounded up to a multiple of
    ``HEAD_ROW_MULTIPLE`` (zero states, target 0, every id allowed: finite values, sliced off by the caller)."""
    extra = round_up(hidden.shape[0], HEAD_ROW_MULTIPLE) - hidden.shape[0]
    if not extra:
        return hidden, targets, allowed
    hidden = F.pad(hidden, (0, 0, 0, extra))
    targets = F.pad(targets, (0, extra))
    if allowed is not None:
        allowed = torch.cat([allowed, allowed.new_ones(extra, allowed.shape[1])])
    return hidden, targets, allowed
