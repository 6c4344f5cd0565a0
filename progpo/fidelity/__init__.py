"""Credit fidelity: every estimator's advantages against Monte-Carlo ground truth on the same batch.

``python -m progpo.fidelity [overrides]`` collects one iteration's batch as training would, scores it with every
estimator in ``fidelity.estimators``, measures the true advantage ``Q(s_t, a_t) - V(s_t)`` of a stratified sample
of its steps by replay and continuation (``truth``), and compares (``scoring``). The measured truth is saved, so
re-scoring any estimator against it (``score_truth``, the fidelity sweep) costs milliseconds.
"""

from progpo.fidelity.config import FidelityConfig, build_estimators, estimator_node
from progpo.fidelity.measure import FidelityResult, measure, point_metrics, score_truth
from progpo.fidelity.scoring import METRICS, Interval, Scores, noise_floor, score
from progpo.fidelity.truth import FidelityTruth

__all__ = [
    "METRICS",
    "FidelityConfig",
    "FidelityResult",
    "FidelityTruth",
    "Interval",
    "Scores",
    "build_estimators",
    "estimator_node",
    "measure",
    "noise_floor",
    "point_metrics",
    "score",
    "score_truth",
]
