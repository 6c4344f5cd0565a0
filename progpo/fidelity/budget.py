"""How many steps and continuations a fidelity measurement needs: the intervals a saved truth would have given with
fewer of either.

    python -m progpo.fidelity.budget outputs/fidelity/<run>/truth.npz

Sub-sampling a measured truth answers it without new runs: with ``s`` of its steps, the width of an estimator's 95%
Spearman interval (bootstrap over steps, so it shrinks like ``1/sqrt(s)``), and with the first ``c`` of its
continuations, the RMS standard error of ``A_hat`` and the noise floor (the Spearman an exact estimator could
reach), which rises with ``c`` towards 1. Steps buy tighter intervals, continuations a higher ceiling. With very few
continuations the standard errors are underestimated (returns that all agree give a sample variance of 0), so
read the small-``c`` rows as optimistic.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, replace

import numpy as np

from progpo.credit import ProGPO
from progpo.fidelity.scoring import noise_floor, score
from progpo.fidelity.truth import FidelityTruth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetRow:
    steps: int
    continuations: int
    rms_se: float  # sqrt(mean SE^2); few continuations underestimate it (returns that all agree give SE 0)
    floor_spearman: float
    ci_width: float  # of the reference estimator's Spearman


def fewer_continuations(truth: FidelityTruth, c: int) -> FidelityTruth:
    """The truth as if only the first ``c`` continuations of each kind had been played."""
    return replace(truth, q_returns=truth.q_returns[:, :c], v_returns=truth.v_returns[:, :c])


def budget_table(truth: FidelityTruth, steps: list[int], continuations: list[int], estimator=None,
                 resamples: int = 500, seed: int = 0) -> list[BudgetRow]:
    """One row per (steps, continuations) pair within what the truth holds; the interval is that of
    ``estimator``'s Spearman (ProGPO at the paper's defaults unless given), averaged over 5 random step subsets."""
    estimator = estimator or ProGPO()
    advantage = truth.estimates(estimator)
    rng = np.random.default_rng(seed)
    rows = []
    for c in [c for c in continuations if 2 <= c <= truth.q_returns.shape[1]]:
        fewer = fewer_continuations(truth, c)
        a_hat, se = fewer.a_hat, fewer.se
        floor = noise_floor(a_hat, se, seed=seed)["spearman"]
        for s in [s for s in steps if 3 <= s <= len(truth.steps)]:
            widths = []
            for _ in range(5):
                pick = rng.choice(len(truth.steps), size=s, replace=False)
                value = score({"est": advantage[pick]}, a_hat[pick], se[pick], resamples, seed).values["est"]
                widths.append(value["spearman"].high - value["spearman"].low)
            rows.append(BudgetRow(s, c, float(np.sqrt(np.mean(se**2))), floor, float(np.mean(widths))))
    return rows


def markdown(rows: list[BudgetRow]) -> str:
    lines = ["| steps | continuations | RMS SE of A_hat | noise floor (Spearman) | 95% interval width (Spearman) |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.steps} | {r.continuations} | {r.rms_se:.3f} | {r.floor_spearman:.3f} | {r.ci_width:.3f} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m progpo.fidelity.budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("truth", help="a truth.npz written by python -m progpo.fidelity")
    parser.add_argument("--steps", type=int, nargs="+", default=[50, 100, 150, 200])
    parser.add_argument("--continuations", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    table = markdown(budget_table(FidelityTruth.load(args.truth), args.steps, args.continuations))
    log.info("%s", table)
    return table


if __name__ == "__main__":
    main()
