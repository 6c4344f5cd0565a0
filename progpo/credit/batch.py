"""The input of every credit estimator: one rollout batch of steps (``StepBatch``).

A batch holds ``n`` steps in any order. Each step belongs to one trajectory (``traj``) of one task
group (``group``); ``t`` is its 0-based index inside the trajectory, ``obs`` the id of the observation
the agent saw before acting, ``reward`` the reward of its action and ``embedding`` (optional) the policy's
hidden state at the action boundary. See ``docs/guide/credit.md``, section "Input".

Construction validates the batch (``ValueError`` naming the field) and computes its ``Layout``: the
permutation that sorts steps by ``(traj, t)`` plus the dense ranks every estimator needs. The layout is
derived from the batch alone, so it is computed once and reused by every estimator call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["Layout", "StepBatch"]

_INT_FIELDS = ("group", "traj", "t", "obs")


def _as_tensor(name: str, value, device: torch.device | None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        out = value
    elif isinstance(value, np.ndarray):
        out = torch.from_numpy(np.ascontiguousarray(value))
    else:
        try:
            out = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name}: cannot convert {type(value).__name__} to a tensor ({err})") from err
    if device is not None:
        out = out.to(device)
    return out


def _is_int(x: torch.Tensor) -> bool:
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


@dataclass(frozen=True, eq=False)
class Layout:
    """Sorted view of a batch, shared by all estimators. ``p`` below is a position in ``order``.

    - ``order[p]``: input index of the p-th step when sorted by ``(traj, t)``.
    - ``traj[p]``, ``t[p]``: dense trajectory rank (0..n_traj-1) and step index.
    - ``group[p]``: dense task-group rank (0..n_groups-1); ``obs[p]``: dense observation rank.
    - ``traj_group[j]``: group rank of trajectory j; ``is_last[p]``: step p ends its trajectory.
    """

    n: int
    order: torch.Tensor
    traj: torch.Tensor
    t: torch.Tensor
    group: torch.Tensor
    obs: torch.Tensor
    traj_group: torch.Tensor
    is_last: torch.Tensor
    n_traj: int
    n_groups: int
    n_obs: int
    max_len: int

    def to_input_order(self, x_sorted: torch.Tensor) -> torch.Tensor:
        """Scatter a per-step tensor from sorted order back to the input order."""
        out = torch.empty_like(x_sorted)
        out[self.order] = x_sorted
        return out


@dataclass(frozen=True, eq=False)
class StepBatch:
    """One rollout batch of ``n`` steps (numpy arrays or torch tensors, all 1-D of length ``n``).

    Args:
        group: int ``[n]``, task group; all rollouts of one task instance share it.
        traj: int ``[n]``, trajectory id, unique in the batch; a trajectory lies in one group.
        t: int ``[n]``, 0-based step index; each trajectory has steps ``0..T-1`` exactly once.
        obs: int ``[n]``, observation id (equal ids iff identical observation text).
        reward: float ``[n]``, reward of the step's action (success reward, invalid-action penalty).
        embedding: optional float ``[n, d]``, policy hidden state at the action boundary.

    All fields are converted to torch tensors on one device (numpy input lands on the CPU; use
    ``StepBatch.to`` to move). The batch is immutable: do not modify its tensors in place.
    """

    group: torch.Tensor
    traj: torch.Tensor
    t: torch.Tensor
    obs: torch.Tensor
    reward: torch.Tensor
    embedding: torch.Tensor | None = None
    layout: Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        device = None
        for name in ("group", "traj", "t", "obs", "reward", "embedding"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                if device is None:
                    device = value.device
                elif value.device != device:
                    raise ValueError(
                        f"{name}: on device {value.device}, expected {device} like the other fields"
                    )
        for name in ("group", "traj", "t", "obs", "reward", "embedding"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _as_tensor(name, value, device))
        n = self._validate_fields()
        object.__setattr__(self, "layout", _build_layout(self.group, self.traj, self.t, self.obs, n))

    # -- validation -----------------------------------------------------------------------------
    def _validate_fields(self) -> int:
        for name in (*_INT_FIELDS, "reward"):
            if getattr(self, name).dim() != 1:
                raise ValueError(
                    f"{name}: expected a 1-D array, got shape {tuple(getattr(self, name).shape)}"
                )
        n = self.group.shape[0]
        for name in ("traj", "t", "obs", "reward"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(
                    f"{name}: length {getattr(self, name).shape[0]} does not match group's length {n}"
                )
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name}: expected an integer dtype, got {value.dtype}")
            if value.dtype != torch.int64:
                object.__setattr__(self, name, value.long())
        if not self.reward.is_floating_point():
            if self.reward.dtype == torch.bool or self.reward.is_complex():
                raise ValueError(f"reward: expected a real dtype, got {self.reward.dtype}")
        if n and not bool(torch.isfinite(self.reward).all()):
            bad = int(torch.nonzero(~torch.isfinite(self.reward))[0, 0])
            raise ValueError(f"reward: non-finite value at index {bad}")
        emb = self.embedding
        if emb is not None:
            if emb.dim() != 2 or emb.shape[0] != n:
                raise ValueError(f"embedding: expected shape [n, d] = [{n}, d], got {tuple(emb.shape)}")
            if not emb.is_floating_point():
                raise ValueError(f"embedding: expected a floating dtype, got {emb.dtype}")
            if emb.shape[1] == 0:
                raise ValueError("embedding: expected shape [n, d] with d >= 1, got d = 0")
            # One cheap pass: NaN/inf propagate into row sums; confirm exactly on a hit (a sum can overflow).
            if n and not bool(torch.isfinite(emb.sum(dim=1)).all()):
                if not bool(torch.isfinite(emb).all()):
                    bad = int(torch.nonzero(~torch.isfinite(emb).all(dim=1))[0, 0])
                    raise ValueError(f"embedding: non-finite value in row {bad}")
        return n

    # -- conveniences ---------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.layout.n

    @property
    def device(self) -> torch.device:
        return self.reward.device

    def __len__(self) -> int:
        return self.n

    def to(self, device: str | torch.device) -> StepBatch:
        """The same batch on ``device`` (validated again there)."""
        emb = None if self.embedding is None else self.embedding.to(device)
        return StepBatch(
            group=self.group.to(device),
            traj=self.traj.to(device),
            t=self.t.to(device),
            obs=self.obs.to(device),
            reward=self.reward.to(device),
            embedding=emb,
        )


def _build_layout(
    group: torch.Tensor, traj: torch.Tensor, t: torch.Tensor, obs: torch.Tensor, n: int
) -> Layout:
    """Sort steps by (traj, t) with one argsort and check trajectory structure (vectorised)."""
    device = group.device
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Layout(0, empty, empty, empty, empty, empty, empty, empty.bool(), 0, 0, 0, 0)
    if bool((t < 0).any()):
        bad = int(torch.nonzero(t < 0)[0, 0])
        raise ValueError(f"t: negative step index {int(t[bad])} at index {bad}")
    traj_ids, traj_rank = torch.unique(traj, return_inverse=True)
    n_traj = traj_ids.shape[0]
    t_max = int(t.max())
    if t_max >= n:
        bad = int(torch.argmax(t))
        raise ValueError(
            f"t: trajectory {int(traj[bad])} has step index {t_max} but the batch holds only {n} steps "
            "(missing steps)"
        )
    key = traj_rank * n + t
    order = torch.argsort(key)
    key_s = key[order]
    traj_s = traj_rank[order]
    t_s = t[order]
    dup = key_s[1:] == key_s[:-1]
    if bool(dup.any()):
        p = int(torch.nonzero(dup)[0, 0])
        raise ValueError(f"t: trajectory {int(traj[order[p]])} has step index {int(t_s[p])} more than once")
    start = torch.ones(n, dtype=torch.bool, device=device)
    start[1:] = traj_s[1:] != traj_s[:-1]
    expected = torch.zeros(n, dtype=torch.long, device=device)
    expected[1:] = t_s[:-1] + 1
    expected[start] = 0
    gap = t_s != expected
    if bool(gap.any()):
        p = int(torch.nonzero(gap)[0, 0])
        raise ValueError(
            f"t: trajectory {int(traj[order[p]])} is missing step index {int(expected[p])} "
            "(each trajectory needs steps 0..T-1 exactly once)"
        )
    group_s = group[order]
    split = (~start[1:]) & (group_s[1:] != group_s[:-1])
    if bool(split.any()):
        p = int(torch.nonzero(split)[0, 0]) + 1
        raise ValueError(
            f"group: trajectory {int(traj[order[p]])} spans two groups "
            f"({int(group_s[p - 1])} and {int(group_s[p])})"
        )
    group_ids, group_rank = torch.unique(group_s, return_inverse=True)
    obs_ids, obs_rank = torch.unique(obs[order], return_inverse=True)
    is_last = torch.ones(n, dtype=torch.bool, device=device)
    is_last[:-1] = start[1:]
    traj_group = torch.zeros(n_traj, dtype=torch.long, device=device)
    traj_group[traj_s] = group_rank
    return Layout(
        n=n,
        order=order,
        traj=traj_s,
        t=t_s,
        group=group_rank,
        obs=obs_rank,
        traj_group=traj_group,
        is_last=is_last,
        n_traj=n_traj,
        n_groups=group_ids.shape[0],
        n_obs=obs_ids.shape[0],
        max_len=t_max + 1,
    )
