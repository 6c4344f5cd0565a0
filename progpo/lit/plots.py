"""The run's own figure: train and held-out success vs iteration, and the credit diagnostics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from progpo.credit import DIAGNOSTIC_STATS


def plot_curves(history: list[dict[str, float]], run_dir: Path, logger: Any) -> None:
    """``curves.png`` in the run folder (and as a logger artifact). Held-out points are drawn as they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from progpo.tracking import log_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("train/success", "-"), ("val/success", "o-"), ("train/score", "--"), ("val/score", "s--")):
        points = [(row["step"], row[key]) for row in history if key in row]
        if points:
            axes[0].plot(*zip(*points), style, label=key)
    axes[0].set(xlabel="iteration", ylabel="success rate (score: 0-1)", ylim=(-0.02, 1.02),
                title="success" + (" and score" if any("val/score" in row for row in history) else ""))
    axes[0].legend()
    for name in DIAGNOSTIC_STATS:
        points = [(row["step"], row[f"credit/{name}"]) for row in history if f"credit/{name}" in row]
        if points:
            axes[1].plot(*zip(*points), label=name)
    axes[1].set(xlabel="iteration", ylabel="share of steps", ylim=(-0.02, 1.02), title="credit diagnostics")
    if axes[1].lines:
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(run_dir / "curves.png", dpi=100)
    if logger is not None:
        log_figure(logger, fig, "curves")
    plt.close(fig)
