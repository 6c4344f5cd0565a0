"""Credit estimators: ``StepBatch -> CreditResult`` (contract: ``docs/guide/credit.md``).

- ``GRPO``: trajectory-level group advantage (paper Eq. 1).
- ``GiGPO``: episode plus anchor-state step advantage (Eqs. 1-2).
- ``HGPO``: hierarchical exact-prefix peer comparison (Eqs. 3-5).
- ``ProGPO``: HGPO plus transition credit from fused, semantically expanded state potentials (Eqs. 3-12).

All are pure, vectorised torch code (CPU or CUDA; the result is on the batch's device).
"""

from .batch import StepBatch
from .gigpo import GiGPO
from .grpo import GRPO
from .hgpo import HGPO
from .knn import FaissKNN, TorchKNN
from .progpo import ProGPO
from .result import DIAGNOSTIC_STATS, CreditResult

__all__ = ["DIAGNOSTIC_STATS", "CreditResult", "FaissKNN", "GRPO", "GiGPO", "HGPO", "ProGPO", "StepBatch", "TorchKNN"]
