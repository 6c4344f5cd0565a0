"""A measurement's results on disk and in MLflow: ``fidelity.md`` (the tables), ``fidelity.csv`` (one row per
estimator, slice and metric), ``fidelity_pairs.csv`` (paired differences), ``fidelity_scatter.png`` (A_est against
A_hat per estimator) and ``fidelity_correlation.png`` (Spearman with intervals, overall and per slice)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import numpy as np

from progpo.fidelity.scoring import METRICS, Scores

log = logging.getLogger(__name__)

FILES = ("fidelity.md", "fidelity.csv", "fidelity_pairs.csv", "fidelity_scatter.png", "fidelity_correlation.png")
TABLE_METRICS = ("spearman", "pearson", "sign_agreement", "coverage", "wrong_sign", "alignment")


def reference_estimator(names: list[str]) -> str:
    """The estimator the others are compared with pairwise: ProGPO when measured, else the first."""
    return "progpo" if "progpo" in names else names[0]


def _cell(value: float, low: float, high: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:+.3f} [{low:+.3f}, {high:+.3f}]"


def _table(scores: Scores, metrics: tuple[str, ...] = TABLE_METRICS) -> list[str]:
    lines = ["| estimator | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for name, values in scores.values.items():
        cells = [_cell(values[m].value, values[m].low, values[m].high) for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(result) -> str:
    """The report of one measurement: what was measured, the overall table, the noise floor, paired differences
    against the reference estimator, the slices, and the time split."""
    truth, scores, meta = result.truth, result.scores, result.truth.meta
    names = list(scores.values)
    ref = reference_estimator(names)
    a_hat, se = truth.a_hat, truth.se
    significant = int((np.abs(a_hat) > 2 * se).sum())
    lines = [
        "# Credit fidelity: estimated advantages against Monte-Carlo truth",
        "",
        f"env {meta.get('env')}, model {meta.get('model')}, seed {meta.get('seed')}, policy "
        f"{meta.get('checkpoint') or 'as built (warm start)'}, iteration {meta.get('iteration')}'s batch "
        f"({meta.get('tasks_per_batch')} tasks x {meta.get('group_size')}, {meta.get('batch_steps')} steps, "
        f"success {meta.get('batch_success', float('nan')):.2f}); machine {meta.get('machine')}.",
        f"{len(truth.steps)} measured steps ({meta.get('steps_dropped', 0)} dropped: replay diverged), "
        f"{meta.get('continuations')} Q + {meta.get('continuations')} V continuations each "
        f"({meta.get('truth_estimator', 'sampled')} estimator on {int(truth.complement.sum())} of them), gamma "
        f"{meta.get('gamma')}; A_hat: mean |A_hat| {np.abs(a_hat).mean():.3f}, median SE {np.median(se):.3f}, "
        f"{significant} steps with |A_hat| > 2 SE (the sign metrics are over those).",
        "",
        "Point value and 95% bootstrap interval over steps.",
        "",
        *_table(scores),
        "",
        "Noise floor (what an estimator returning the true advantage would score against this A_hat): "
        + ", ".join(f"{m} {result.floor[m]:+.3f}" for m in METRICS if np.isfinite(result.floor[m])) + ".",
        "",
        f"## Paired differences against {ref} (same steps, same resamples)",
        "",
        "| estimator | " + " | ".join(f"{m} - {ref}" for m in ("spearman", "pearson", "sign_agreement")) + " |",
        "|---|---|---|---|",
    ]
    for name in names:
        if name != ref:
            cells = [str(scores.paired(name, ref, m)) for m in ("spearman", "pearson", "sign_agreement")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## By slice (Spearman with interval; steps in the slice)", ""]
    slice_names = list(result.slices)
    lines.append("| estimator | " + " | ".join(f"{s} ({result.slices[s].n_steps})" for s in slice_names) + " |")
    lines.append("|---|" + "---|" * len(slice_names))
    for name in names:
        cells = [str(result.slices[s].values[name]["spearman"]) for s in slice_names]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    timing = result.timing or meta.get("timing") or {}
    if timing:
        lines += ["", "## Time", "", ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in timing.items())]
    return "\n".join(lines) + "\n"


def csv_rows(result) -> list[dict[str, Any]]:
    rows = []
    for where, scores in (("all", result.scores), *result.slices.items()):
        for name, values in scores.values.items():
            for metric in METRICS:
                v = values[metric]
                rows.append({"slice": where, "estimator": name, "metric": metric, "value": v.value, "low": v.low,
                             "high": v.high, "n_steps": scores.n_steps})
    for metric in METRICS:
        rows.append({"slice": "all", "estimator": "noise_floor", "metric": metric, "value": result.floor[metric],
                     "low": float("nan"), "high": float("nan"), "n_steps": result.scores.n_steps})
    return rows


def pair_rows(result) -> list[dict[str, Any]]:
    names = list(result.scores.values)
    rows = []
    for a in names:
        for b in names:
            if a < b:
                for metric in METRICS:
                    d = result.scores.paired(a, b, metric)
                    rows.append({"a": a, "b": b, "metric": metric, "a_minus_b": d.value, "low": d.low,
                                 "high": d.high})
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def figures(result, out_dir: Path) -> list[tuple[Any, str]]:
    """The scatter grid and the correlation bars (matplotlib figures, saved beside the tables)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.scores.values)
    a_hat, se = result.truth.a_hat, result.truth.se
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    scatter, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        ax.errorbar(a_hat, result.estimates[name], xerr=se, fmt="o", ms=2.5, alpha=0.5, elinewidth=0.5)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"{name}: rho {result.scores.values[name]['spearman'].value:+.2f}", fontsize=9)
        ax.set_xlabel("A_hat (Monte Carlo)", fontsize=8)
        ax.set_ylabel("A_est", fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    scatter.tight_layout()
    bars, ax = plt.subplots(figsize=(1.2 + 1.1 * len(names) * (1 + len(result.slices) / 4), 3.6))
    groups = [("all", result.scores), *result.slices.items()]
    width = 0.8 / len(groups)
    for k, (label, scores) in enumerate(groups):
        values = [scores.values[n]["spearman"] for n in names]
        x = np.arange(len(names)) + (k - (len(groups) - 1) / 2) * width
        err = np.array([[v.value - v.low for v in values], [v.high - v.value for v in values]])
        ax.bar(x, [v.value for v in values], width, yerr=np.nan_to_num(err), capsize=1.5, label=label)
    ax.axhline(result.floor["spearman"], color="black", ls="--", lw=0.8, label="noise floor")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(np.arange(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel("Spearman with A_hat (95% CI)")
    ax.legend(fontsize=7, ncol=4)
    bars.tight_layout()
    scatter.savefig(out_dir / "fidelity_scatter.png", dpi=110)
    bars.savefig(out_dir / "fidelity_correlation.png", dpi=110)
    return [(scatter, "fidelity_scatter"), (bars, "fidelity_correlation")]


def metrics_for_logger(result) -> dict[str, float]:
    """Flat ``fidelity/<estimator>/<metric>`` (and ``_low`` / ``_high``) values, the noise floor and timings."""
    out: dict[str, float] = {"fidelity/steps": float(result.scores.n_steps)}
    for name, values in result.scores.values.items():
        for metric, v in values.items():
            if np.isfinite(v.value):
                out[f"fidelity/{name}/{metric}"] = v.value
                out[f"fidelity/{name}/{metric}_low"] = v.low
                out[f"fidelity/{name}/{metric}_high"] = v.high
    for metric, value in result.floor.items():
        if np.isfinite(value):
            out[f"fidelity/noise_floor/{metric}"] = value
    for key, value in (result.timing or {}).items():
        out[f"perf/fidelity_{key}"] = float(value)
    return out


def write_outputs(result, out_dir: Path, logger: Any) -> None:
    """Tables, CSVs and figures into ``out_dir``; metrics, files and figures to ``logger``'s run (MLflow)."""
    import matplotlib.pyplot as plt

    from progpo.tracking import log_figure, log_files

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = markdown(result)
    (out_dir / "fidelity.md").write_text(report)
    _write_csv(out_dir / "fidelity.csv", csv_rows(result))
    pairs = pair_rows(result)
    if pairs:
        _write_csv(out_dir / "fidelity_pairs.csv", pairs)
    made = figures(result, out_dir)
    if logger is not None:
        meta = result.truth.meta
        if hasattr(logger, "set_tags"):
            logger.set_tags({"fidelity.policy": meta.get("checkpoint") or "as built",
                             "fidelity.iteration": meta.get("iteration"), "fidelity.steps": len(result.truth.steps),
                             "fidelity.continuations": meta.get("continuations")})
        logger.log_metrics(metrics_for_logger(result), step=0)
        log_files(logger, [out_dir / f for f in (*FILES[:3], "truth.npz") if (out_dir / f).is_file()], "fidelity")
        for fig, name in made:
            log_figure(logger, fig, name)
    for fig, _ in made:
        plt.close(fig)
    log.info("credit fidelity (%s):\n%s", out_dir, "\n".join(_table(result.scores, ("spearman", "sign_agreement",
                                                                                       "coverage"))))
