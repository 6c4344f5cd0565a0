"""The report's tables: final success per task type (Tables 1 and 3), credit diagnostics (Table 2); Markdown, CSV."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.alfworld.scenes import TASK_LABELS
from progpo.report.records import CREDIT_KEYS, RunRecord, _sort_key

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


def _fmt(cell: Cell) -> str:
    """'52.0 ± 3.1 [44.3, 59.7]' (percent: mean ± std [95% CI]); the mean alone for one seed, '-' for none."""
    if cell.n == 0:
        return "-"
    text = f"{100 * cell.mean:.1f}"
    if cell.std is None or cell.ci95 is None:
        return text
    low, high = cell.mean - cell.ci95, cell.mean + cell.ci95
    return f"{text} ± {100 * cell.std:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


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
