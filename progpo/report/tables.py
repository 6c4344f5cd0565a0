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


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float | None  # sample std over seeds; None with a single seed
    n: int


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


def _fmt(cell: Cell) -> str:
    if cell.n == 0:
        return "-"
    text = f"{100 * cell.mean:.1f}"
    return f"{text} ({100 * cell.std:.1f})" if cell.std is not None else text


def to_markdown(title: str, note: str, columns: list[str], rows: list[dict[str, Any]]) -> str:
    lines = [f"### {title}", "", note, "", "| env | method | seeds | " + " | ".join(columns) + " |",
             "|---|---|---:|" + "---:|" * len(columns)]
    for row in rows:
        cells = [_fmt(row["cells"][c]) if c in row["cells"] else "-" for c in columns]
        lines.append(f"| {row['env']} | {row['method']} | {row['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Tidy CSV: one line per (env, method, metric) with mean, std and the number of seeds (fractions, not %)."""
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["env", "method", "metric", "mean", "std", "n"])
        for row in rows:
            for column in columns:
                cell = row["cells"].get(column)
                if cell is None or cell.n == 0:
                    continue
                writer.writerow([row["env"], row["method"], column, f"{cell.mean:.10g}",
                                 "" if cell.std is None else f"{cell.std:.10g}", cell.n])
