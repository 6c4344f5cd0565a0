"""The report's figures: success (Figure 4) and credit diagnostics (Figure 5) vs iteration; credit fidelity per
estimator and measured policy (Figure 6, Table 4 drawn).

Only dense curves are EMA-smoothed (``is_dense``): a curve of a few points (held-out evaluation every few
iterations) would be dragged toward its first values by the EMA, so such curves are drawn as they are. Held-out
success is always drawn as it is, with the spread over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from progpo.report.records import CREDIT_KEYS, SCORE_KEYS, FidelityRecord, RunRecord, _sort_key
from progpo.report.tables import (
    FIDELITY_METRIC_TITLES,
    FIDELITY_METRICS,
    NOISE_FLOOR,
    counted_fidelity_runs,
    fidelity_table,
    policy_column,
)

# The paper's colours (Figure 4): ProGPO red, HGPO orange, GiGPO green, GRPO blue.
METHOD_COLOURS = {"progpo": "tab:red", "hgpo": "tab:orange", "gigpo": "tab:green", "grpo": "tab:blue"}
ABLATION_COLOURS = {"plain": "tab:gray", "semantic": "tab:purple", "fusion": "tab:cyan", "full": "tab:red"}
EMA_DECAY = 0.95
# A curve with fewer points is drawn raw: the EMA (decay 0.95, a window of ~20 points) would mostly show its start.
DENSE_MIN_POINTS = 10
SPREAD = "±1 sample std over seeds"  # what the error bars and bands show, named in the figures' titles


def ema(values: Sequence[float], decay: float = EMA_DECAY) -> list[float]:
    """Bias-corrected exponential moving average (TensorBoard-style): the first point equals the first value."""
    if not 0 <= decay < 1:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    out, acc, weight = [], 0.0, 0.0
    for value in values:
        acc = decay * acc + (1 - decay) * value
        weight = decay * weight + (1 - decay)
        out.append(acc / weight)
    return out


def is_dense(steps: Sequence[int]) -> bool:
    """Whether a curve has enough points for the EMA to smooth noise rather than hide where the curve ends."""
    return len(steps) >= DENSE_MIN_POINTS


@dataclass(frozen=True)
class SeedCurve:
    """One metric of a group of runs: at each logged step, the mean and sample std over the seeds that logged it."""

    steps: list[int]
    mean: list[float]
    std: list[float]  # 0.0 at a step only one seed logged


def seed_curve(records: Sequence[RunRecord], key: str) -> SeedCurve:
    """Mean and spread over runs at each logged step (steps where only some seeds have a value use those seeds)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for step, value in r.history.get(key, []):
            if not math.isnan(value):
                by_step[step].append(value)
    steps = sorted(by_step)
    return SeedCurve(steps=steps, mean=[statistics.fmean(by_step[s]) for s in steps],
                     std=[statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps])


def mean_curve(records: Sequence[RunRecord], key: str) -> tuple[list[int], list[float]]:
    """Mean over runs at each logged step (steps where only some seeds have a value use those seeds)."""
    curve = seed_curve(records, key)
    return curve.steps, curve.mean


def _colour(label: str) -> str | None:
    method, _, rest = label.partition("[")
    ablation = rest.rstrip("]")
    return ABLATION_COLOURS.get(ablation) if ablation else METHOD_COLOURS.get(method)


def _plot_points(ax: Any, curve: SeedCurve, label: str, colour: str | None) -> None:
    """A sparse curve as it is: markers and a thin line through the means, error bars for the seed spread."""
    ax.errorbar(curve.steps, curve.mean, yerr=curve.std, color=colour, marker="o", markersize=4, linewidth=1,
                capsize=3, label=label)


def _plot_smoothed(ax: Any, curve: SeedCurve, label: str, colour: str | None) -> None:
    """A dense curve: seed spread as a light band, the raw mean light, its EMA dark (the labelled line)."""
    low = [m - s for m, s in zip(curve.mean, curve.std)]
    high = [m + s for m, s in zip(curve.mean, curve.std)]
    (line,) = ax.plot(curve.steps, curve.mean, alpha=0.3, color=colour, linewidth=1)
    ax.fill_between(curve.steps, low, high, color=line.get_color(), alpha=0.12, linewidth=0)
    ax.plot(curve.steps, ema(curve.mean), color=line.get_color(), linewidth=2, label=label)


def success_figure(records: Sequence[RunRecord], env: str):
    """Figure 4: training success (EMA when dense) and held-out success (never smoothed) vs iteration per method.

    Runs that log a purchase score (WebShop's ``train/score``, ``val/score``) get a second row, drawn the same way:
    the paper reports WebShop's score beside its success.
    """
    import matplotlib.pyplot as plt

    metrics = ["success"] + (["score"] if any(k in r.history for r in records for k in SCORE_KEYS) else [])
    fig, grid = plt.subplots(len(metrics), 2, figsize=(11, 4 * len(metrics)), sharey="row", squeeze=False)
    labels = sorted({r.label for r in records}, key=_sort_key)
    for row, metric in zip(grid, metrics):
        for ax, split, title in zip(row, ("train", "val"), ("training", "held-out")):
            key = f"{split}/{metric}"
            for label in labels:
                curve = seed_curve([r for r in records if r.label == label], key)
                if not curve.steps:
                    continue
                if split == "train" and is_dense(curve.steps):
                    _plot_smoothed(ax, curve, label, _colour(label))
                else:
                    _plot_points(ax, curve, label, _colour(label))
            ax.set_title(f"{env}: {title} {metric}")
            ax.set_xlabel("RL iteration")
            ax.grid(alpha=0.3)
        row[0].set_ylabel("success rate" if metric == "success" else "purchase score")
        row[0].set_ylim(-0.02, 1.02)
        row[1 if row[1].has_data() else 0].legend(loc="lower right", fontsize=8)  # held-out may be missing
    fig.suptitle(f"{' and '.join(metrics).capitalize()} vs iteration, "
                 f"mean over seeds. Training: raw (light) and EMA decay {EMA_DECAY} (dark) "
                 f"when >= {DENSE_MIN_POINTS} points, band {SPREAD}.\nHeld-out: each evaluation as measured "
                 f"(not smoothed), error bars {SPREAD}.", fontsize=9)
    fig.tight_layout()
    return fig


def credit_figure(records: Sequence[RunRecord], env: str):
    """Figure 5: credit/* shares vs iteration per method; EMA when dense (raw transition-only faint), else raw."""
    import matplotlib.pyplot as plt

    labels = [lb for lb in sorted({r.label for r in records}, key=_sort_key)
              if any(f"credit/{k}" in r.history for r in records if r.label == lb for k in CREDIT_KEYS)]
    fig, axes = plt.subplots(1, max(len(labels), 1), figsize=(4.5 * max(len(labels), 1), 3.8), sharey=True,
                             squeeze=False)
    colours = dict(zip(CREDIT_KEYS, ("tab:blue", "tab:red", "tab:orange", "tab:gray", "tab:green")))
    for ax, label in zip(axes[0], labels):
        group = [r for r in records if r.label == label]
        for key in CREDIT_KEYS:
            steps, values = mean_curve(group, f"credit/{key}")
            if not steps:
                continue
            name = key.replace("_", "-")
            if not is_dense(steps):
                ax.plot(steps, values, color=colours[key], linewidth=1, marker="o", markersize=4, label=name)
                continue
            if key == "transition_only":
                ax.plot(steps, values, color=colours[key], alpha=0.25, linewidth=1)
            ax.plot(steps, ema(values), color=colours[key], linewidth=2, label=name)
        ax.set_title(f"{env}: {label}")
        ax.set_xlabel("RL iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of steps")
    axes[0][0].set_ylim(-0.02, 1.02)
    if labels:
        axes[0][-1].legend(loc="best", fontsize=8)
    fig.suptitle(f"Credit mechanism diagnostics, mean over seeds: EMA decay {EMA_DECAY} when >= {DENSE_MIN_POINTS} "
                 "points (raw transition-only faint), raw with markers otherwise", fontsize=9)
    fig.tight_layout()
    return fig


def fidelity_figure(records: Sequence[FidelityRecord], env: str):
    """Figure 6 (Table 4 drawn): per estimator, one bar per measured policy of the mean over seeds of Spearman (top)
    and sign agreement (bottom) with the 95% t-interval over seeds (none for one seed), each seed's value as a dot,
    and that policy's noise floor as a dashed line of its colour."""
    import matplotlib.pyplot as plt
    import numpy as np

    env_records = [r for r in records if r.env == env]
    columns, rows = fidelity_table(env_records)
    bars = [row for row in rows if row["estimator"] != NOISE_FLOOR]
    floor = next((row for row in rows if row["estimator"] == NOISE_FLOOR), None)
    counted = {column: [r for r in counted_fidelity_runs(env_records) if policy_column(r) == column]
               for column in columns}
    size = (max(8.0, 4.5 + 0.65 * len(bars) * max(len(columns), 1)), 3.4 * len(FIDELITY_METRICS))
    fig, axes = plt.subplots(len(FIDELITY_METRICS), 1, figsize=size, sharex=True, squeeze=False)
    width = 0.8 / max(len(columns), 1)
    x = np.arange(len(bars))
    for ax, metric in zip(axes[:, 0], FIDELITY_METRICS):
        for k, column in enumerate(columns):
            colour = f"C{k}"
            offset = x + (k - (len(columns) - 1) / 2) * width
            cells = [row["cells"][(column, metric)] for row in bars]
            means = [c.mean if c.n else np.nan for c in cells]
            errors = [c.ci95 if c.ci95 is not None else 0.0 for c in cells]
            ax.bar(offset, means, width, yerr=errors, capsize=3, color=colour, alpha=0.75, label=column.label)
            for xi, row in zip(offset, bars):
                seeds = [r.value(row["estimator"], metric) for r in counted[column]]
                seeds = [v for v in seeds if not math.isnan(v)]
                ax.plot([xi] * len(seeds), seeds, "o", color="black", markersize=2.5, alpha=0.6)
            if floor is not None and floor["cells"][(column, metric)].n:
                ax.axhline(floor["cells"][(column, metric)].mean, color=colour, linestyle="--", linewidth=1,
                           label=f"noise floor, {column.label}")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_ylabel(f"{FIDELITY_METRIC_TITLES[metric]} with MC advantage")
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylim(min(-0.05, axes[0, 0].get_ylim()[0]), 1.05)
    axes[-1, 0].set_ylim(0, 1.05)
    axes[-1, 0].set_xticks(x, [row["estimator"] for row in bars], rotation=20, fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{env}: credit fidelity against Monte-Carlo advantages (Table 4)\nbars: mean over seeds with "
                 "the 95% t-interval over seeds; dots: seeds;\ndashed: noise floor (what an exact estimator would "
                 "score given the measurement noise)", fontsize=9)
    fig.tight_layout()
    return fig

