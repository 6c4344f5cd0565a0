"""How close each estimator's advantages are to the Monte-Carlo truth, with bootstrap intervals over steps.

Every metric is computed row-wise on ``[R, s]`` arrays (R bootstrap resamples of the ``s`` measured steps), so
the point estimate, the 95% interval and the paired difference between two estimators come from one code path:

- ``spearman`` / ``pearson``: rank / linear correlation of ``A_est`` with ``A_hat`` (0 for a constant ``A_est``:
  an estimator that says the same thing everywhere carries no ordering);
- ``sign_agreement``, ``wrong_sign``, ``coverage``: over the steps whose ``|A_hat| > 2 SE`` (the truth's sign is
  known there): the share whose estimate has the truth's sign, the opposite sign, or is non-zero at all
  (``sign_agreement + wrong_sign = coverage``);
- ``alignment``: ``sum(A_est * A_hat) / (|A_est| |A_hat|)``, the cosine of the two vectors (scale-free, not
  centred: it rewards getting the sign of the big steps right).

``noise_floor`` tells what an exact estimator would score against an ``A_hat`` with this noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

METRICS = ("spearman", "pearson", "sign_agreement", "wrong_sign", "coverage", "alignment")
NONZERO = 1e-6  # |A| at or below this is "no credit" (the contract's eps)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% bootstrap interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(axis=-1) * (yc * yc).sum(axis=-1))
    num = (xc * yc).sum(axis=-1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 1e-12)


def _share(hit: np.ndarray, among: np.ndarray) -> np.ndarray:
    count = among.sum(axis=-1)
    return np.divide((hit & among).sum(axis=-1), count, out=np.full(count.shape, np.nan), where=count > 0)


def metric_rows(est: np.ndarray, hat: np.ndarray, se: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of each row of ``est`` against the same row of ``hat`` (``[..., s]`` arrays)."""
    est, hat, se = np.broadcast_arrays(np.asarray(est, float), np.asarray(hat, float), np.asarray(se, float))
    significant = np.abs(hat) > 2 * se
    nonzero = np.abs(est) > NONZERO
    agree = nonzero & (np.sign(est) == np.sign(hat))
    opposite = nonzero & (np.sign(est) == -np.sign(hat))
    norms = np.sqrt((est * est).sum(axis=-1) * (hat * hat).sum(axis=-1))
    dot = (est * hat).sum(axis=-1)
    return {
        "spearman": _pearson_rows(rankdata(est, axis=-1), rankdata(hat, axis=-1)),
        "pearson": _pearson_rows(est, hat),
        "sign_agreement": _share(agree, significant),
        "wrong_sign": _share(opposite, significant),
        "coverage": _share(nonzero, significant),
        "alignment": np.divide(dot, norms, out=np.zeros_like(dot), where=norms > 1e-12),
    }


def bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """``[resamples, n]`` step indices drawn with replacement; shared by every estimator so differences pair."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(point: float, rows: np.ndarray) -> Interval:
    rows = rows[np.isfinite(rows)]
    if not np.isfinite(point) or rows.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    low, high = np.percentile(rows, [2.5, 97.5])
    return Interval(float(point), float(low), float(high))


@dataclass
class Scores:
    """Per estimator and metric, the point value with its interval; ``rows`` keeps the bootstrap replicates so
    that differences between estimators can be formed on the same resamples (``paired``)."""

    n_steps: int
    values: dict[str, dict[str, Interval]]
    rows: dict[str, dict[str, np.ndarray]]

    def paired(self, a: str, b: str, metric: str) -> Interval:
        """``metric(a) - metric(b)`` on the same steps, with its interval over the same resamples."""
        point = self.values[a][metric].value - self.values[b][metric].value
        return _interval(point, self.rows[a][metric] - self.rows[b][metric])


def score(estimates: Mapping[str, np.ndarray], hat: np.ndarray, se: np.ndarray, resamples: int = 1000,
          seed: int = 0) -> Scores:
    """Every estimator's metrics against ``hat`` on the same ``s`` steps, with 95% bootstrap intervals."""
    hat, se = np.asarray(hat, float), np.asarray(se, float)
    idx = bootstrap_indices(len(hat), resamples, seed)
    values: dict[str, dict[str, Interval]] = {}
    rows: dict[str, dict[str, np.ndarray]] = {}
    for name, est in estimates.items():
        est = np.asarray(est, float)
        point = metric_rows(est, hat, se)
        rows[name] = metric_rows(est[idx], hat[idx], se[idx])
        values[name] = {m: _interval(float(point[m]), rows[name][m]) for m in METRICS}
    return Scores(len(hat), values, rows)


def noise_floor(hat: np.ndarray, se: np.ndarray, draws: int = 200, seed: int = 0) -> dict[str, float]:
    """What an estimator that returned the *true* advantage would score, given ``A_hat``'s own noise.

    The true advantages are modelled as ``A_hat`` shrunk to the variance it has beyond its noise
    (``var(A) = var(A_hat) - mean(SE^2)``); each draw adds fresh noise of the measured standard errors to them
    and scores the truth against the noisy copy. A measured correlation near this value is as good as the
    measurement can show.
    """
    hat, se = np.asarray(hat, float), np.asarray(se, float)
    centre = hat.mean()
    spread = hat.var()
    shrink = np.sqrt(max(spread - float(np.mean(se**2)), 0.0) / spread) if spread > 0 else 0.0
    truth = centre + shrink * (hat - centre)
    noisy = truth + np.random.default_rng(seed).standard_normal((draws, len(hat))) * se
    rows = metric_rows(np.broadcast_to(truth, noisy.shape), noisy, np.broadcast_to(se, noisy.shape))
    return {m: float(np.mean(finite)) if (finite := rows[m][np.isfinite(rows[m])]).size else float("nan")
            for m in METRICS}
