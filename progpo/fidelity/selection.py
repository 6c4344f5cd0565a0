"""Which steps of the batch get a Monte-Carlo truth: a stratified sample, and the slices the report splits by.

Three yes/no features of a step define eight strata, sampled as evenly as their sizes allow (a plain random
sample would be mostly late steps of lost trajectories, and the question is where credit is right):

- ``peers``: another step of the same task group saw the same observation (the depth-1 exact-prefix group has
  at least two members, ``docs/guide/credit.md``), so peer comparison has something to compare with;
- ``late``: the step index is at or above the batch's median step index;
- ``won``: the step's trajectory was won.
"""

from __future__ import annotations

import numpy as np

from progpo.credit import StepBatch

FEATURES = ("peers", "late", "won")
# The report's slices: (name, feature, value).
SLICES = (
    ("with peers", "peers", True), ("without peers", "peers", False),
    ("early", "late", False), ("late", "late", True),
    ("won", "won", True), ("lost", "won", False),
)  # fmt: skip


def step_features(steps: StepBatch, won_traj: dict[int, bool]) -> dict[str, np.ndarray]:
    """The three features of every step of the batch (boolean arrays of length ``steps.n``)."""
    group = steps.group.cpu().numpy()
    obs = steps.obs.cpu().numpy()
    t = steps.t.cpu().numpy()
    traj = steps.traj.cpu().numpy()
    _, inverse, counts = np.unique(np.stack([group, obs], axis=1), axis=0, return_inverse=True,
                                   return_counts=True)
    return {
        "peers": counts[inverse.reshape(-1)] >= 2,
        "late": t >= np.median(t),
        "won": np.array([won_traj[int(j)] for j in traj], dtype=bool),
    }


def stratified_sample(features: dict[str, np.ndarray], n_steps: int, seed: int) -> np.ndarray:
    """``n_steps`` distinct step indices, as evenly over the non-empty strata as their sizes allow (a stratum
    smaller than its share gives all its steps and the rest goes to the others); sorted."""
    n = len(next(iter(features.values())))
    if n_steps > n:
        raise ValueError(f"fidelity.steps={n_steps} is more than the batch's {n} steps")
    code = sum(features[name].astype(np.int64) << k for k, name in enumerate(FEATURES))
    rng = np.random.default_rng(seed)
    strata = [rng.permutation(np.flatnonzero(code == c)) for c in range(1 << len(FEATURES))]
    strata = [s for s in strata if s.size]
    take = np.zeros(len(strata), dtype=np.int64)
    left = n_steps
    while left:
        open_ = [k for k, s in enumerate(strata) if take[k] < s.size]
        share, extra = divmod(left, len(open_))
        for rank, k in enumerate(open_):
            add = min(share + (rank < extra), strata[k].size - take[k])
            take[k] += add
            left -= add
    return np.sort(np.concatenate([s[:k] for s, k in zip(strata, take)]))
