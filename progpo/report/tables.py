"""The report's tables: final success per task type (Tables 1 and 3), credit diagnostics (Table 2), credit fidelity
(Table 4); Markdown, CSV."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.alfworld.scenes import TASK_LABELS
from progpo.report.records import (
    ABLATION_ORDER,
    CREDIT_KEYS,
    METHOD_ORDER,
    FidelityRecord,
    RunRecord,
    _sort_key,
)

CELL_NOTE = ("Cells: mean ± sample std over seeds [95% confidence interval of the mean over seeds: "
             "mean ± t(0.975, n-1)·std/√n], in percent; a single seed gives the value alone. "
             "The interval is over seeds only (not the noise within each run); it is not clipped to [0, 100].")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: a two-sided 95% interval of a mean of
    ``df + 1`` seeds."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    from scipy.stats import t

    return float(t.ppf(0.975, df))


@dataclass(frozen=True)
class Cell:
    """One metric of a group of runs, over its seeds."""

    mean: float
    std: float | None  # sample std over seeds; None with a single seed
    n: int

    @property
    def ci95(self) -> float | None:
        """Half-width of the 95% t-interval of the mean over seeds; None with a single seed (no spread known)."""
        if self.std is None or self.n < 2:
            return None
        return t975(self.n - 1) * self.std / math.sqrt(self.n)


def _cell(values: Sequence[float]) -> Cell:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return Cell(float("nan"), None, 0)
    std = statistics.stdev(values) if len(values) > 1 else None
    return Cell(statistics.fmean(values), std, len(values))


def _task_columns(records: Iterable[RunRecord], prefix: str) -> list[tuple[str, str]]:
    """(column title, metric key) for per-task success, the overall success and any score metric."""
    keys = {k for r in records for k in r.final}
    types = sorted(k[len(prefix) + len("success/") :] for k in keys if k.startswith(f"{prefix}success/"))
    order = list(TASK_LABELS)
    types.sort(key=lambda t: (order.index(t) if t in order else len(order), t))
    columns = [(TASK_LABELS.get(t, t), f"{prefix}success/{t}") for t in types]
    columns.append(("All", f"{prefix}success"))
    columns += [(k[len(prefix) :], k) for k in sorted(keys) if k.startswith(prefix) and "score" in k]
    return columns


def final_table(records: Sequence[RunRecord], prefix: str = "val/") -> tuple[list[str], list[dict[str, Any]]]:
    """Rows (env, label) x columns (task types, All, scores) of final metric mean/std over seeds."""
    by_group: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for r in records:
        by_group[(r.env, r.label)].append(r)
    rows = []
    for env in sorted({r.env for r in records}):
        env_records = [r for r in records if r.env == env]
        columns = _task_columns(env_records, prefix)
        for label in sorted({r.label for r in env_records}, key=_sort_key):
            group = by_group[(env, label)]
            cells = {title: _cell([r.final.get(key, float("nan")) for r in group]) for title, key in columns}
            rows.append({"env": env, "method": label, "seeds": len(group), "cells": cells})
    titles = list(dict.fromkeys(t for row in rows for t in row["cells"]))
    return titles, rows


def credit_table(records: Sequence[RunRecord]) -> tuple[list[str], list[dict[str, Any]]]:
    """Rows (env, label): mean over iterations of each credit/* share, then mean/std over seeds."""
    by_group: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for r in records:
        if any(f"credit/{k}" in r.history for k in CREDIT_KEYS):
            by_group[(r.env, r.label)].append(r)
    rows = []
    for (env, label) in sorted(by_group, key=lambda g: (g[0], _sort_key(g[1]))):
        group = by_group[(env, label)]
        cells = {}
        for key in CREDIT_KEYS:
            per_run = [statistics.fmean(v for _, v in r.history[f"credit/{key}"])
                       for r in group if r.history.get(f"credit/{key}")]
            cells[key] = _cell(per_run)
        rows.append({"env": env, "method": label, "seeds": len(group), "cells": cells})
    return list(CREDIT_KEYS), rows


@dataclass(frozen=True)
class SeedRow:
    """One run's held-out success at its first and last evaluation (fractions)."""

    env: str
    method: str
    seed: str
    start_step: int
    start: float
    end_step: int
    end: float

    @property
    def change(self) -> float:
        return self.end - self.start


def seed_rows(records: Sequence[RunRecord], key: str = "val/success") -> list[SeedRow]:
    """One row per run with ``key`` logged, ordered by env, method, seed.

    Every seed's first held-out evaluation starts from the same warm start but samples its own episodes, so the
    starts differ by the evaluation's noise; a seed's own change is the paired view of its result."""
    rows = []
    for r in sorted(records, key=lambda r: (r.env, _sort_key(r.label), r.seed)):
        if r.history.get(key):
            (first_step, first), (last_step, last) = r.history[key][0], r.history[key][-1]
            rows.append(SeedRow(r.env, r.label, r.seed, first_step, first, last_step, last))
    return rows


def seed_markdown(title: str, rows: Sequence[SeedRow], percent: bool = True) -> str:
    """``seed_rows`` as a Markdown table (percent, or a score as it is, and the iteration each value was measured at)."""
    unit, change = ("In percent", "change (pts)") if percent else ("A fraction in [0, 1]", "change")
    scale, digits = (100, 1) if percent else (1, 3)
    lines = [f"### {title}", "", f"{unit}; `it` = iterations done when it was measured.", "",
             f"| env | method | seed | start | end | {change} |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r.env} | {r.method} | {r.seed} | {scale * r.start:.{digits}f} (it {r.start_step}) | "
              f"{scale * r.end:.{digits}f} (it {r.end_step}) | {scale * r.change:+.{digits}f} |" for r in rows]
    return "\n".join(lines) + "\n"


def seed_csv(path: Path, rows: Sequence[SeedRow]) -> None:
    """``seed_rows`` as CSV (fractions)."""
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["env", "method", "seed", "start_step", "start", "end_step", "end", "change"])
        writer.writerows([r.env, r.method, r.seed, r.start_step, f"{r.start:.10g}", r.end_step, f"{r.end:.10g}",
                          f"{r.change:.10g}"] for r in rows)


def _fmt(cell: Cell, scale: float = 100, digits: int = 1) -> str:
    """'52.0 ± 3.1 [44.3, 59.7]' (percent: mean ± std [95% CI]); the mean alone for one seed, '-' for none.
    ``scale=1, digits=3``: the values as they are ('0.412 ± 0.050 [0.288, 0.536]')."""
    if cell.n == 0:
        return "-"
    text = f"{scale * cell.mean:.{digits}f}"
    if cell.std is None or cell.ci95 is None:
        return text
    low, high = cell.mean - cell.ci95, cell.mean + cell.ci95
    return f"{text} ± {scale * cell.std:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


def to_markdown(title: str, note: str, columns: list[str], rows: list[dict[str, Any]]) -> str:
    """A Markdown table under ``title``; ``note`` says what was measured, then ``CELL_NOTE`` how cells read."""
    lines = [f"### {title}", "", f"{note} {CELL_NOTE}", "", "| env | method | seeds | " + " | ".join(columns) + " |",
             "|---|---|---:|" + "---:|" * len(columns)]
    for row in rows:
        cells = [_fmt(row["cells"][c]) if c in row["cells"] else "-" for c in columns]
        lines.append(f"| {row['env']} | {row['method']} | {row['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Tidy CSV: one line per (env, method, metric) with mean, std, the 95% CI half-width (``ci95``) over seeds and
    the number of seeds (fractions, not %; std and ci95 empty with one seed)."""
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["env", "method", "metric", "mean", "std", "ci95", "n"])
        for row in rows:
            for column in columns:
                cell = row["cells"].get(column)
                if cell is None or cell.n == 0:
                    continue
                writer.writerow([row["env"], row["method"], column, f"{cell.mean:.10g}",
                                 _number(cell.std), _number(cell.ci95), cell.n])


def _number(value: float | None) -> str:
    """A CSV number: empty for None, so a reader tells 'not defined (one seed)' from zero."""
    return "" if value is None else f"{value:.10g}"


# Table 4: credit fidelity (``python -m progpo.fidelity`` runs).

FIDELITY_METRICS = ("spearman", "sign_agreement")  # Table 4's metrics, per estimator and measured policy
FIDELITY_METRIC_TITLES = {"spearman": "Spearman", "sign_agreement": "sign agreement"}
NOISE_FLOOR = "noise_floor"  # the row of what an exact estimator would score given the measurement noise
FIDELITY_NOTE = (
    "Each `python -m progpo.fidelity` run scores every estimator's advantages on one batch of the measured policy "
    "against Monte-Carlo advantages of a sample of its steps: Spearman = rank correlation with the Monte-Carlo "
    "advantage; sign agreement = share of the steps whose Monte-Carlo advantage is beyond 2 standard errors where "
    "the estimate has its sign. Columns: the measured policy (`fidelity.iteration`: the warm start, or a checkpoint "
    "after that many RL iterations). `noise floor`: what an exact estimator would score given the measurement "
    "noise. Cells: mean ± sample std over seeds [95% confidence interval of the mean over seeds: mean ± t(0.975, "
    "n-1)·std/√n], as fractions (not percent); a single seed gives the value alone; n = seeds. The interval is over "
    "seeds only; each run's own 95% bootstrap interval over its measured steps is in `table4_fidelity_runs.csv`. A "
    "seed measured more than once at one policy counts once: its latest run.")


@dataclass(frozen=True, order=True)
class PolicyColumn:
    """A measured policy, Table 4's column group: the warm start or a checkpoint after ``iteration`` iterations."""

    iteration: int  # -1 when the run did not log it
    warm_start: bool = False

    @property
    def label(self) -> str:
        where = f"iteration {self.iteration}" if self.iteration >= 0 else "iteration unknown"
        return f"warm start ({where})" if self.warm_start else where


def policy_column(record: FidelityRecord) -> PolicyColumn:
    return PolicyColumn(record.iteration if record.iteration is not None else -1, record.warm_start)


def _estimator_key(name: str) -> tuple[int, int, str]:
    """grpo, gigpo, hgpo, progpo; then the ProGPO variants in Table 3's order; then any other; the noise floor last."""
    if name == NOISE_FLOOR:
        return 3, 0, name
    if name in METHOD_ORDER:
        return 0, METHOD_ORDER.index(name), name
    method, _, variant = name.partition("_")
    if method in METHOD_ORDER and variant in ABLATION_ORDER:
        return 1, METHOD_ORDER.index(method) * len(ABLATION_ORDER) + ABLATION_ORDER.index(variant), name
    return 2, 0, name


def counted_fidelity_runs(records: Sequence[FidelityRecord]) -> list[FidelityRecord]:
    """The runs Table 4 averages: of a seed measured more than once at one policy (same env), the latest run."""
    latest: dict[tuple[str, PolicyColumn, str], FidelityRecord] = {}
    for r in sorted(records, key=lambda r: (r.start_time, r.run_id)):
        latest[(r.env, policy_column(r), r.seed)] = r
    return sorted(latest.values(), key=lambda r: (r.env, policy_column(r), r.seed, r.run_id))


def fidelity_table(records: Sequence[FidelityRecord]) -> tuple[list[PolicyColumn], list[dict[str, Any]]]:
    """Rows (env, estimator, then the noise floor) x (measured policy, metric): mean/std over seeds of each run's
    point value. ``cells`` is keyed by ``(PolicyColumn, metric)``."""
    counted = counted_fidelity_runs(records)
    columns = sorted({policy_column(r) for r in counted})
    rows = []
    for env in sorted({r.env for r in counted}):
        env_runs = [r for r in counted if r.env == env]
        estimators = sorted({e for r in env_runs for e in r.estimators} | {NOISE_FLOOR}, key=_estimator_key)
        for estimator in estimators:
            cells = {}
            for column in columns:
                runs = [r for r in env_runs if policy_column(r) == column]
                for metric in FIDELITY_METRICS:
                    cells[(column, metric)] = _cell([r.value(estimator, metric) for r in runs])
            if any(cell.n for cell in cells.values()):
                rows.append({"env": env, "estimator": estimator, "cells": cells})
    return columns, rows


def fidelity_markdown(title: str, note: str, columns: Sequence[PolicyColumn], rows: Sequence[dict[str, Any]]) -> str:
    """Table 4 as Markdown: per measured policy, Spearman, sign agreement and the number of seeds (the sign
    agreement's own n in brackets when fewer seeds had a step with a known sign)."""
    header = ["env", "estimator"]
    for column in columns:
        header += [f"{column.label}: {FIDELITY_METRIC_TITLES[m]}" for m in FIDELITY_METRICS] + [f"{column.label}: n"]
    lines = [f"### {title}", "", note, "", "| " + " | ".join(header) + " |",
             "|---|---|" + "---:|" * (len(header) - 2)]
    for row in rows:
        cells = [row["env"], "noise floor" if row["estimator"] == NOISE_FLOOR else row["estimator"]]
        for column in columns:
            n = row["cells"][(column, FIDELITY_METRICS[0])].n
            for metric in FIDELITY_METRICS:
                cell = row["cells"][(column, metric)]
                cells.append(_fmt(cell, 1, 3) + (f" (n {cell.n})" if cell.n and cell.n != n else ""))
            cells.append(str(n) if n else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fidelity_csv(path: Path, columns: Sequence[PolicyColumn], rows: Sequence[dict[str, Any]]) -> None:
    """Table 4 as tidy CSV: one line per (env, estimator, policy, metric) with mean, std, ci95 (half-width of the
    95% t-interval over seeds) and n (std and ci95 empty with one seed)."""
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["env", "estimator", "policy", "iteration", "metric", "mean", "std", "ci95", "n"])
        for row in rows:
            for column in columns:
                for metric in FIDELITY_METRICS:
                    cell = row["cells"][(column, metric)]
                    if cell.n:
                        writer.writerow([row["env"], row["estimator"], column.label, column.iteration, metric,
                                         f"{cell.mean:.10g}", _number(cell.std), _number(cell.ci95), cell.n])


def fidelity_runs_csv(path: Path, records: Sequence[FidelityRecord]) -> None:
    """Every fidelity run x estimator (and its noise floor): the point value of each of Table 4's metrics with its
    95% bootstrap interval over the run's measured steps; ``counted`` says whether Table 4 averages the run."""
    import csv

    counted = {r.run_id for r in counted_fidelity_runs(records)}
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["env", "policy", "iteration", "seed", "estimator",
                         *(f"{m}{b}" for m in FIDELITY_METRICS for b in ("", "_low", "_high")),
                         "steps", "checkpoint", "run_id", "counted"])
        for r in sorted(records, key=lambda r: (r.env, policy_column(r), r.seed, r.start_time, r.run_id)):
            column = policy_column(r)
            for estimator in [*sorted(r.estimators, key=_estimator_key), NOISE_FLOOR]:
                values = [_number(_finite(r.value(estimator, m, b))) for m in FIDELITY_METRICS
                          for b in ("", "_low", "_high")]
                if estimator == NOISE_FLOOR and not any(values):
                    continue
                steps = r.metrics.get("fidelity/steps")
                writer.writerow([r.env, column.label, column.iteration, r.seed, estimator, *values,
                                 "" if steps is None else int(steps), "" if r.warm_start else r.policy, r.run_id,
                                 str(r.run_id in counted).lower()])


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
