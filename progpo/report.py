"""`python -m progpo.report --experiment NAME`: the paper's tables and figures from the runs of one MLflow experiment.

Writes to ``--out`` (default ``outputs/reports/<experiment>``) and attaches the same files to a ``report`` run
in the experiment (tag ``progpo.kind=report``; re-running the report overwrites that run's artifacts):

- ``table1_success.md/.csv``: final held-out success per method (mean and std over seeds), per task type (Table 1);
- ``table2_credit.md/.csv``: mean over iterations of the ``credit/*`` diagnostics per method (Table 2);
- ``table3_ablation.md/.csv``: final training success per ablation variant, when runs carry an ``ablation`` tag
  (Table 3: measured on training rollouts, like the paper);
- ``fig4_success_<env>.png``: success vs iteration per method, raw (light) and EMA-smoothed with decay 0.95 (Figure 4);
- ``fig5_credit_<env>.png``: ``credit/*`` shares vs iteration per method, EMA-smoothed, raw transition-only faint
  (Figure 5).

Runs are grouped by ``method`` (the credit choice) plus ``[ablation]`` when set, and by ``env``; seeds are the runs
of a group. Only FINISHED runs count unless ``--all-runs``; the report says how many it left out and in which state.
A RUNNING run whose process is gone (tag ``progpo.process``: same host, that process no longer runs; e.g. killed
with SIGKILL) is marked KILLED first. ``--group`` keeps the runs of one multirun or study.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.alfworld.scenes import TASK_LABELS
from progpo.credit.result import DIAGNOSTIC_STATS
from progpo.tracking.mlflow_logger import KIND_TAG
from progpo.tracking.run_info import PROCESS_TAG, process_is_gone

log = logging.getLogger(__name__)

METHOD_ORDER = ("grpo", "gigpo", "hgpo", "progpo")
ABLATION_ORDER = ("plain", "semantic", "fusion", "full")
# The paper's colours (Figure 4): ProGPO red, HGPO orange, GiGPO green, GRPO blue.
METHOD_COLOURS = {"progpo": "tab:red", "hgpo": "tab:orange", "gigpo": "tab:green", "grpo": "tab:blue"}
ABLATION_COLOURS = {"plain": "tab:gray", "semantic": "tab:purple", "fusion": "tab:cyan", "full": "tab:red"}
CREDIT_KEYS = DIAGNOSTIC_STATS
CURVE_KEYS = ("train/success", "val/success", *(f"credit/{k}" for k in CREDIT_KEYS))
EMA_DECAY = 0.95


@dataclass
class RunRecord:
    """One training run as the report sees it."""

    run_id: str
    method: str
    env: str
    seed: str
    ablation: str | None
    status: str
    final: dict[str, float]  # latest value of every metric
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # step-sorted, for CURVE_KEYS

    @property
    def label(self) -> str:
        return f"{self.method}[{self.ablation}]" if self.ablation else self.method


@dataclass(frozen=True)
class ReportFiles:
    """Where the report went."""

    out_dir: Path
    tables: list[Path]
    figures: list[Path]
    n_runs: int
    report_run_id: str | None
    left_out: dict[str, int] = field(default_factory=dict)  # training runs not in the report, by MLflow status


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


def _sort_key(label: str) -> tuple[int, int, str]:
    method, _, rest = label.partition("[")
    ablation = rest.rstrip("]")
    m = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    a = ABLATION_ORDER.index(ablation) if ablation in ABLATION_ORDER else (-1 if not ablation else len(ABLATION_ORDER))
    return m, a, label


def _colour(label: str) -> str | None:
    method, _, rest = label.partition("[")
    ablation = rest.rstrip("]")
    return ABLATION_COLOURS.get(ablation) if ablation else METHOD_COLOURS.get(method)


# ----------------------------------------------------------------------------------------------- loading


LEFT_OUT_WHY = {
    "RUNNING": "still training, or killed on another host",
    "KILLED": "killed or pruned; a killed run continues with resume=true",
    "FAILED": "raised an error",
    "SCHEDULED": "never started",
}


def describe_left_out(left_out: dict[str, int]) -> str:
    """'left out 3 runs that did not finish: 2 KILLED (killed or pruned; ...), 1 RUNNING (...)'."""
    if not left_out:
        return "left out no runs"
    parts = ", ".join(f"{n} {status} ({LEFT_OUT_WHY.get(status, 'not finished')})"
                      for status, n in sorted(left_out.items(), key=lambda item: -item[1]))
    return f"left out {sum(left_out.values())} run(s) that did not finish: {parts}; --all-runs includes them"


def _status(client: Any, run: Any) -> str:
    """The run's status, after marking a RUNNING run whose process is gone as KILLED."""
    status = run.info.status
    process = run.data.tags.get(PROCESS_TAG)
    if status == "RUNNING" and process and process_is_gone(process):
        log.info("run %s (%s) is RUNNING but its process %s is gone: marking it KILLED", run.info.run_id,
                 run.info.run_name, process)
        client.set_terminated(run.info.run_id, "KILLED")
        return "KILLED"
    return status


def load_runs(
    client: Any, experiment: str, group: str | None = None, all_runs: bool = False
) -> tuple[list[RunRecord], dict[str, int]]:
    """Training runs of ``experiment`` (report runs excluded), with final metrics and curve histories; and the
    number of training runs left out (not FINISHED, unless ``all_runs``) by status."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        known = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"--experiment {experiment!r} does not exist in this tracking store; known: {known}")
    query = f"tags.group = '{group}'" if group else ""
    runs = client.search_runs([found.experiment_id], filter_string=query, max_results=5000)
    records = []
    left_out: Counter[str] = Counter()
    for run in runs:
        tags = run.data.tags
        if tags.get(KIND_TAG) == "report":
            continue
        status = _status(client, run)
        if not all_runs and status != "FINISHED":
            left_out[status] += 1
            continue
        record = RunRecord(
            run_id=run.info.run_id,
            method=tags.get("method", "unknown"),
            env=tags.get("env", "unknown"),
            seed=tags.get("seed", "?"),
            ablation=tags.get("ablation") or None,
            status=status,
            final=dict(run.data.metrics),
        )
        for key in CURVE_KEYS:
            if key in record.final:
                points = client.get_metric_history(run.info.run_id, key)
                record.history[key] = sorted((int(m.step), float(m.value)) for m in points)
        records.append(record)
    log.info("experiment %r: %d training runs%s", experiment, len(records), f" in group {group!r}" if group else "")
    if left_out:
        log.warning("experiment %r: %s", experiment, describe_left_out(left_out))
    return records, dict(left_out)


# ----------------------------------------------------------------------------------------------- tables


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


# ----------------------------------------------------------------------------------------------- figures


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


# ----------------------------------------------------------------------------------------------- driver


def write_report(records: Sequence[RunRecord], out_dir: Path, experiment: str) -> tuple[list[Path], list[Path]]:
    """Write tables (Markdown + CSV) and figures (PNG) for ``records`` into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    tables: list[Path] = []
    sections = [f"# Report: MLflow experiment `{experiment}`", "",
                f"{len(records)} runs; cells are mean (sample std over seeds) in percent.", ""]
    specs = [
        ("table1_success", "Table 1: final held-out success", "Last `val/success*` of each run.",
         final_table(records, "val/")),
        ("table2_credit", "Table 2: credit diagnostics", "Mean over iterations of the `credit/*` shares "
         "(peer-zero before transition credit, still-zero after composition).", credit_table(records)),
    ]
    if any(r.ablation for r in records):
        specs.append(("table3_ablation", "Table 3: transition-credit ablations (training rollouts)",
                      "Last `train/success*` of each run, per ablation variant.",
                      final_table([r for r in records if r.ablation], "train/")))
    for stem, title, note, (columns, rows) in specs:
        markdown = to_markdown(title, note, columns, rows)
        (out_dir / f"{stem}.md").write_text(markdown)
        to_csv(out_dir / f"{stem}.csv", columns, rows)
        tables += [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
        sections.append(markdown)
    figures: list[Path] = []
    for env in sorted({r.env for r in records}):
        env_records = [r for r in records if r.env == env]
        for stem, build in (("fig4_success", success_figure), ("fig5_credit", credit_figure)):
            fig = build(env_records, env)
            path = out_dir / f"{stem}_{env}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            figures.append(path)
            sections.append(f"![{stem} {env}]({path.name})\n")
    (out_dir / "report.md").write_text("\n".join(sections))
    tables.insert(0, out_dir / "report.md")
    return tables, figures


def attach_to_mlflow(client: Any, experiment: str, out_dir: Path) -> str:
    """Log ``out_dir`` as artifacts of the experiment's ``report`` run (created once, then reused)."""
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'report'", max_results=1)
    if runs:
        run_id = runs[0].info.run_id
    else:
        run_id = client.create_run(found.experiment_id, run_name="report", tags={KIND_TAG: "report"}).info.run_id
    client.log_artifacts(run_id, str(out_dir), "report")
    client.set_terminated(run_id, "FINISHED")
    return run_id


def make_report(
    experiment: str,
    out_dir: str | Path | None = None,
    tracking_uri: str | None = None,
    group: str | None = None,
    all_runs: bool = False,
    upload: bool = True,
) -> ReportFiles:
    """Read the experiment's runs from MLflow and write (and attach) the report."""
    from mlflow import MlflowClient

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///outputs/mlflow.db"
    client = MlflowClient(uri)
    records, left_out = load_runs(client, experiment, group=group, all_runs=all_runs)
    if not records:
        raise ValueError(
            f"experiment {experiment!r} has no {'' if all_runs else 'FINISHED '}training runs"
            f"{f' in group {group!r}' if group else ''} ({describe_left_out(left_out)})"
        )
    out = Path(out_dir) if out_dir else Path("outputs") / "reports" / experiment
    tables, figures = write_report(records, out, experiment)
    run_id = attach_to_mlflow(client, experiment, out) if upload else None
    return ReportFiles(out_dir=out, tables=tables, figures=figures, n_runs=len(records), report_run_id=run_id,
                       left_out=left_out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m progpo.report", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", required=True, help="MLflow experiment name (logger.experiment_name)")
    parser.add_argument("--out", default=None, help="output folder (default outputs/reports/<experiment>)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///outputs/mlflow.db)")
    parser.add_argument("--group", default=None, help="only runs with this `group` tag (one multirun or study)")
    parser.add_argument("--all-runs", action="store_true", help="include runs that did not finish")
    parser.add_argument("--no-upload", action="store_true", help="do not attach the report to MLflow")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        files = make_report(opts.experiment, opts.out, opts.tracking_uri, opts.group, opts.all_runs,
                            upload=not opts.no_upload)
    except ValueError as error:
        log.error("%s", error)
        return 2
    print((files.out_dir / "report.md").read_text())  # noqa: T201 - CLI output
    print(f"wrote {len(files.tables)} tables and {len(files.figures)} figures to {files.out_dir} from "  # noqa: T201
          f"{files.n_runs} FINISHED run(s); {describe_left_out(files.left_out)}"
          + (f"; MLflow report run {files.report_run_id}" if files.report_run_id else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

