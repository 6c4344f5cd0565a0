"""Rank, world size and the few collectives the RL loop needs; every helper is a no-op in one process.

Lightning's strategy (DDP, FSDP, ...) starts the processes and the ``torch.distributed`` process group; this
module only reads it. Data parallelism in progpo is by task group: each rank plays a contiguous shard of the
iteration's tasks (:func:`shard`), with global group and trajectory ids, so prefix groups are whole on one rank.
What needs the whole batch (credit with ``sem_scope=batch``, metrics, the minibatch plan) gathers or reduces
through the helpers below. Tensors travel on the backend's device (CUDA for NCCL, CPU for gloo) and come back on
the device they left.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist

T = TypeVar("T")


def active() -> bool:
    """True when a process group with more than one rank is running."""
    return torch_dist.is_available() and torch_dist.is_initialized() and torch_dist.get_world_size() > 1


def rank() -> int:
    return torch_dist.get_rank() if active() else 0


def world_size() -> int:
    return torch_dist.get_world_size() if active() else 1


def launch_rank() -> int:
    """This process's global rank as the launcher's environment tells it, before any process group exists.

    The same reading as Lightning's ``rank_zero_only`` (``RANK``, then ``LOCAL_RANK``, ``SLURM_PROCID``,
    ``JSM_NAMESPACE_RANK``): torchrun and ``srun`` set ``RANK``/``SLURM_PROCID``; Lightning's own launcher sets
    ``LOCAL_RANK`` in the processes it starts (one node). 0 in a plain single process.
    """
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key) not in (None, ""):
            return int(os.environ[key])
    return 0


def is_primary() -> bool:
    """The process that writes (run folder, MLflow, summaries): global rank 0, also before the group exists."""
    return rank() == 0 if active() else launch_rank() == 0


def shard(n: int, rank_: int | None = None, world: int | None = None) -> tuple[int, int]:
    """``[start, stop)`` of rank's contiguous share of ``n`` items; shares differ in size by at most one."""
    rank_ = rank() if rank_ is None else rank_
    world = world_size() if world is None else world
    base, extra = divmod(n, world)
    start = rank_ * base + min(rank_, extra)
    return start, start + base + (1 if rank_ < extra else 0)


def _comm_device() -> torch.device:
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0, in rank order (row counts may differ)."""
    if not active():
        return tensor
    device = _comm_device()
    local = tensor.to(device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world_size())]
    torch_dist.all_gather(sizes, torch.tensor([local.shape[0]], dtype=torch.long, device=device))
    counts = [int(s.item()) for s in sizes]
    padded = local.new_zeros((max(counts), *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in counts]
    torch_dist.all_gather(parts, padded)
    return torch.cat([part[:count] for part, count in zip(parts, counts)]).to(tensor.device)


def row_offset(n_local: int) -> int:
    """How many rows the ranks before this one hold (where this rank's rows start in :func:`gather_rows`)."""
    if not active():
        return 0
    counts = gather_rows(torch.tensor([n_local], dtype=torch.long))
    return int(counts[: rank()].sum())


def gather_objects(items: Sequence[T]) -> list[T]:
    """Every rank's ``items`` (picklable), concatenated in rank order."""
    if not active():
        return list(items)
    parts: list[Any] = [None] * world_size()
    torch_dist.all_gather_object(parts, list(items))
    return [item for part in parts for item in part]


def _reduce(values: dict[str, float], op) -> dict[str, float]:
    if not active() or not values:
        return dict(values)
    names = list(values)
    flat = torch.tensor([float(values[k]) for k in names], dtype=torch.float64, device=_comm_device())
    torch_dist.all_reduce(flat, op=op)
    return dict(zip(names, flat.cpu().tolist()))


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over the ranks (one ``all_reduce``, float64)."""
    return _reduce(values, torch_dist.ReduceOp.SUM)


def max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each value's maximum over the ranks (one ``all_reduce``, float64)."""
    return _reduce(values, torch_dist.ReduceOp.MAX)
