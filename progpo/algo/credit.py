"""Credit over the whole iteration's batch, whichever ranks hold its steps.

Each rank plays whole task groups, so a group-local estimator would be exact on its own rank; ``sem_scope=batch``
(semantic neighbours from any state of the batch) and the diagnostics (fractions of *all* steps) are not. So every
rank gathers the steps of all ranks (ids, rewards, state embeddings: a few numbers per step, ``d`` floats with
embeddings), runs the estimator on the gathered batch and keeps its own rows. The estimator is pure tensor code
and cheap next to an update, and the result is the single-process one for every estimator and every scope.
"""

from __future__ import annotations

from progpo import dist
from progpo.credit import CreditResult, StepBatch


def batch_credit(estimator, local: StepBatch) -> CreditResult:
    """``estimator`` on the steps of all ranks; advantages, returns and parts of this rank's rows, batch-wide stats.

    The local batch's ``group`` and ``traj`` ids must be global (unique across ranks), as the collector makes them.
    """
    if not dist.active():
        return estimator(local)
    fields = {name: dist.gather_rows(getattr(local, name)) for name in ("group", "traj", "t", "obs", "reward")}
    embedding = dist.gather_rows(local.embedding) if local.embedding is not None else None
    full = estimator(StepBatch(**fields, embedding=embedding))
    start = dist.row_offset(local.n)
    rows = slice(start, start + local.n)
    return CreditResult(
        advantage=full.advantage[rows].clone(),
        returns=full.returns[rows].clone(),
        stats=dict(full.stats),
        parts={name: values[rows].clone() for name, values in full.parts.items()},
    )

