"""The report's figures: success (Figure 4) and credit diagnostics (Figure 5) vs iteration, EMA-smoothed."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from progpo.report.records import CREDIT_KEYS, RunRecord, _sort_key

# The paper's colours (Figure 4): ProGPO red, HGPO orange, GiGPO green, GRPO blue.
METHOD_COLOURS = {"progpo": "tab:red", "hgpo": "tab:orange", "gigpo": "tab:green", "grpo": "tab:blue"}
ABLATION_COLOURS = {"plain": "tab:gray", "semantic": "tab:purple", "fusion": "tab:cyan", "full": "tab:red"}
EMA_DECAY = 0.95


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


def _colour(label: str) -> str | None:
    method, _, rest = label.partition("[")
    ablation = rest.rstrip("]")
    return ABLATION_COLOURS.get(ablation) if ablation else METHOD_COLOURS.get(method)


def mean_curve(records: Sequence[RunRecord], key: str) -> tuple[list[int], list[float]]:
    """Mean over runs at each logged step (steps where only some seeds have a value use those seeds)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in records:
        for step, value in r.history.get(key, []):
            if not math.isnan(value):
                by_step[step].append(value)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def _plot_curve(ax: Any, steps: list[int], values: list[float], label: str, colour: str | None,
                raw_alpha: float = 0.3) -> None:
    marker = "o" if len(steps) <= 3 else None
    (line,) = ax.plot(steps, values, alpha=raw_alpha, color=colour, linewidth=1, marker=marker)
    ax.plot(steps, ema(values), color=line.get_color(), linewidth=2, label=label, marker=marker)


def success_figure(records: Sequence[RunRecord], env: str):
    """Figure 4: training and held-out success vs iteration per method (raw light, EMA dark)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    labels = sorted({r.label for r in records}, key=_sort_key)
    for ax, key, title in zip(axes, ("train/success", "val/success"), ("training success", "held-out success")):
        for label in labels:
            steps, values = mean_curve([r for r in records if r.label == label], key)
            if steps:
                _plot_curve(ax, steps, values, label, _colour(label))
        ax.set_title(f"{env}: {title}")
        ax.set_xlabel("RL iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Success vs iteration (mean over seeds; EMA decay {EMA_DECAY})", fontsize=10)
    fig.tight_layout()
    return fig


def credit_figure(records: Sequence[RunRecord], env: str):
    """Figure 5: credit/* shares vs iteration per method, EMA-smoothed; raw transition-only faint."""
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
            marker = "o" if len(steps) <= 3 else None
            if key == "transition_only":
                ax.plot(steps, values, color=colours[key], alpha=0.25, linewidth=1, marker=marker)
            ax.plot(steps, ema(values), color=colours[key], linewidth=2, label=key.replace("_", "-"), marker=marker)
        ax.set_title(f"{env}: {label}")
        ax.set_xlabel("RL iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of steps")
    axes[0][0].set_ylim(-0.02, 1.02)
    if labels:
        axes[0][-1].legend(loc="best", fontsize=8)
    fig.suptitle(f"Credit mechanism diagnostics (EMA decay {EMA_DECAY})", fontsize=10)
    fig.tight_layout()
    return fig
