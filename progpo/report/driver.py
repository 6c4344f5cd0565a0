"""``make_report``: read the runs, write the tables and figures, attach them to the experiment's report run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from progpo.report.archive import (
    ARCHIVE_NAME,
    load_archive,
    load_fidelity_archive,
    merge_records,
    save_archive,
)
from progpo.report.figures import credit_figure, fidelity_figure, success_figure
from progpo.report.records import (
    FidelityRecord,
    RunRecord,
    UnknownExperiment,
    describe_left_out,
    load_fidelity_runs,
    load_runs,
)
from progpo.report.tables import (
    FIDELITY_NOTE,
    credit_table,
    fidelity_csv,
    fidelity_markdown,
    fidelity_runs_csv,
    fidelity_table,
    final_table,
    seed_csv,
    seed_markdown,
    seed_rows,
    to_csv,
    to_markdown,
)
from progpo.tracking.mlflow_logger import KIND_TAG


@dataclass(frozen=True)
class ReportFiles:
    """Where the report went."""

    out_dir: Path
    tables: list[Path]
    figures: list[Path]
    n_runs: int
    report_run_id: str | None
    left_out: dict[str, int] = field(default_factory=dict)  # training runs not in the report, by MLflow status
    n_fidelity_runs: int = 0  # credit-fidelity runs (Table 4)
    fidelity_left_out: dict[str, int] = field(default_factory=dict)  # fidelity runs not in the report, by status


def write_report(records: Sequence[RunRecord], out_dir: Path, experiment: str,
                 fidelity: Sequence[FidelityRecord] = (), fidelity_left_out: dict[str, int] | None = None
                 ) -> tuple[list[Path], list[Path]]:
    """Write tables (Markdown + CSV), figures (PNG) and the records themselves (``runs.json``) into ``out_dir``:
    Tables 1-3 and Figures 4-5 from the training runs ``records``, Table 4 and Figure 6 from the credit-fidelity
    runs ``fidelity`` (each set only when there are such runs)."""
    import matplotlib

    matplotlib.use("Agg")

    out_dir.mkdir(parents=True, exist_ok=True)
    counts = f"{len(records)} runs" + (f" and {len(fidelity)} credit-fidelity runs (Table 4)" if fidelity else "")
    sections = [f"# Report: MLflow experiment `{experiment}`", "",
                f"{counts}; cells are mean ± sample std over seeds [95% t-interval of the mean over "
                "seeds], in percent" + (" (Table 4: as fractions)" if fidelity else "") + ".", "",
                machines_line([*records, *fidelity]), ""]
    tables: list[Path] = []
    figures: list[Path] = []
    if records:
        tables += _write_tables(_table_specs(records), out_dir, sections)
        tables += _write_seed_table(records, out_dir, sections)
    if fidelity:
        tables += _write_fidelity_table(fidelity, fidelity_left_out or {}, out_dir, sections)
    if records:
        figures += _write_figures(records, out_dir, sections)
    if fidelity:
        figures += _write_fidelity_figures(fidelity, out_dir, sections)
    sections.append(f"The runs behind these tables: [`{ARCHIVE_NAME}`]({ARCHIVE_NAME}) (rebuild with `python -m "
                    f"progpo.report --experiment {experiment} --records <this folder>/{ARCHIVE_NAME}`).\n")
    (out_dir / "report.md").write_text("\n".join(sections))
    tables.insert(0, out_dir / "report.md")
    tables.append(save_archive(out_dir / ARCHIVE_NAME, experiment, records, fidelity))
    return tables, figures


def machines_line(records: Sequence[RunRecord | FidelityRecord]) -> str:
    """Which machines the runs ran on (tag ``machine``): runs of different CPUs are not like for like."""
    counts: dict[str, int] = {}
    for record in records:
        label = record.machine or "not logged (runs older than the machine tag)"
        counts[label] = counts.get(label, 0) + 1
    listed = "; ".join(f"{label}: {n} run(s)" for label, n in sorted(counts.items()))
    warning = (" **Runs from more than one machine: their float results differ (a warm start built on each is a "
               "different policy), so compare within one machine.**") if len(counts) > 1 else ""
    return f"Machines: {listed}.{warning}"


TableSpec = tuple[str, str, str, tuple[list[str], list[dict[str, Any]]]]  # file stem, title, note, (columns, rows)


def _table_specs(records: Sequence[RunRecord]) -> list[TableSpec]:
    """Tables 1 and 2, and Table 3 when some runs carry an ``ablation`` tag."""
    specs = [
        ("table1_success", "Table 1: final held-out success", "Last `val/success*` of each run (itself an "
         "estimate from a finite set of held-out games, a noise the interval over seeds does not include).",
         final_table(records, "val/")),
        ("table2_credit", "Table 2: credit diagnostics", "Mean over iterations of the `credit/*` shares "
         "(peer-zero before transition credit, still-zero after composition).", credit_table(records)),
    ]
    if any(r.ablation for r in records):
        specs.append(("table3_ablation", "Table 3: transition-credit ablations (training rollouts)",
                      "Last `train/success*` of each run, per ablation variant (a ProGPO run without an "
                      "`ablation` tag counts as the variant its credit config is, e.g. `full` at the paper "
                      "defaults).", final_table(ablation_records(records), "train/")))
    return specs


def ablation_records(records: Sequence[RunRecord]) -> list[RunRecord]:
    """Table 3's runs, labelled ``progpo[variant]``: every run with a variant, a run tagged with it winning over an
    untagged ProGPO run of the same env and seed (the same config trained twice counts once)."""
    tagged = {(r.env, r.variant, r.seed) for r in records if r.ablation}
    return [replace(r, ablation=r.variant) for r in records
            if r.variant and (r.ablation or (r.env, r.variant, r.seed) not in tagged)]


def _write_tables(specs: Sequence[TableSpec], out_dir: Path, sections: list[str]) -> list[Path]:
    """Each table as ``<stem>.md`` and ``<stem>.csv``; its Markdown is appended to ``sections``."""
    tables: list[Path] = []
    for stem, title, note, (columns, rows) in specs:
        markdown = to_markdown(title, note, columns, rows)
        (out_dir / f"{stem}.md").write_text(markdown)
        to_csv(out_dir / f"{stem}.csv", columns, rows)
        tables += [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
        sections.append(markdown)
    return tables


SEED_TABLES = (  # (metric, file stem, title, in percent)
    ("val/success", "table1_seeds", "Table 1, per seed: held-out success at the first and last evaluation", True),
    ("val/score", "table1_seeds_score", "Table 1, per seed: held-out purchase score at the first and last evaluation",
     False),  # WebShop's score, beside its success as the paper reports it
    ("val/option_match", "table1_seeds_options",
     "Table 1, per seed: held-out option match (share of the goal's options the purchase got right) at the first and "
     "last evaluation", False),  # WebShop: what success needs beyond the score's product type and attributes
)


def _write_seed_table(records: Sequence[RunRecord], out_dir: Path, sections: list[str]) -> list[Path]:
    """``table1_seeds.md/.csv``: every run's held-out success at its first and last evaluation, and the change (and
    ``table1_seeds_score``/``table1_seeds_options`` the same for runs that log WebShop's score/option match)."""
    written: list[Path] = []
    for key, stem, title, percent in SEED_TABLES:
        rows = seed_rows(records, key)
        if not rows:
            continue
        markdown = seed_markdown(title, rows, percent)
        (out_dir / f"{stem}.md").write_text(markdown)
        seed_csv(out_dir / f"{stem}.csv", rows)
        sections.append(markdown)
        written += [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
    return written


def _write_figures(records: Sequence[RunRecord], out_dir: Path, sections: list[str]) -> list[Path]:
    """Figures 4 and 5 of every env as PNG; a link to each is appended to ``sections``. When the experiment holds
    both method runs and ablation runs, the methods get ``fig4_success``/``fig5_credit`` and the variants (as in
    Table 3) their own ``fig4_ablation``/``fig5_ablation``, so neither figure carries seven lines."""

    methods = [r for r in records if not r.ablation]
    sets = [("fig4_success", "fig5_credit", methods or list(records))]
    if methods and any(r.ablation for r in records):
        sets.append(("fig4_ablation", "fig5_ablation", ablation_records(records)))
    figures: list[Path] = []
    for success_stem, credit_stem, chosen in sets:
        for env in sorted({r.env for r in chosen}):
            env_records = [r for r in chosen if r.env == env]
            for stem, build in ((success_stem, success_figure), (credit_stem, credit_figure)):
                figures.append(_save_figure(build(env_records, env), out_dir, stem, env, sections))
    return figures


def _save_figure(fig, out_dir: Path, stem: str, env: str, sections: list[str]) -> Path:
    """``<stem>_<env>.png`` in ``out_dir``, closed, with a link to it appended to ``sections``."""
    import matplotlib.pyplot as plt

    path = out_dir / f"{stem}_{env}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    sections.append(f"![{stem} {env}]({path.name})\n")
    return path


def _write_fidelity_table(fidelity: Sequence[FidelityRecord], left_out: dict[str, int], out_dir: Path,
                          sections: list[str]) -> list[Path]:
    """Table 4 (``table4_fidelity.md/.csv``) and every run's values with their bootstrap intervals
    (``table4_fidelity_runs.csv``); the Markdown is appended to ``sections``."""
    columns, rows = fidelity_table(fidelity)
    markdown = fidelity_markdown("Table 4: credit fidelity (estimated against Monte-Carlo advantages)",
                                 FIDELITY_NOTE, columns, rows)
    paths = [out_dir / "table4_fidelity.md", out_dir / "table4_fidelity.csv", out_dir / "table4_fidelity_runs.csv"]
    paths[0].write_text(markdown)
    fidelity_csv(paths[1], columns, rows)
    fidelity_runs_csv(paths[2], fidelity)
    sections.append(markdown)
    if left_out:  # in report.md only: the table itself is what the runs (and their runs.json) rebuild
        sections.append(f"Fidelity runs: {describe_left_out(left_out)}.\n")
    return paths


def _write_fidelity_figures(fidelity: Sequence[FidelityRecord], out_dir: Path, sections: list[str]) -> list[Path]:
    """Figure 6 of every env (``fig6_fidelity_<env>.png``); a link to each is appended to ``sections``."""
    return [_save_figure(fidelity_figure(fidelity, env), out_dir, "fig6_fidelity", env, sections)
            for env in sorted({r.env for r in fidelity})]


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
    archives: Sequence[str | Path] = (),
) -> ReportFiles:
    """Read the experiment's runs from MLflow (training runs and credit-fidelity runs), add those of ``archives``
    (earlier reports' ``runs.json``) that the store does not hold, and write (and attach) the report. With archives,
    the store may lack the experiment."""
    from mlflow import MlflowClient

    archived = [r for path in archives for r in load_archive(path, experiment)
                if group is None or r.group == group]
    archived_fidelity = [r for path in archives for r in load_fidelity_archive(path, experiment)
                         if group is None or r.group == group]
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///outputs/mlflow.db"
    client = MlflowClient(uri)
    try:
        records, left_out = load_runs(client, experiment, group=group, all_runs=all_runs)
        fidelity, fidelity_left_out = load_fidelity_runs(client, experiment, group=group, all_runs=all_runs)
    except UnknownExperiment:
        if not archives:
            raise
        records, left_out, upload = [], {}, False  # nothing of it in this store: the report is the archive's
        fidelity, fidelity_left_out = [], {}
    records = merge_records(records, archived)
    fidelity = merge_records(fidelity, archived_fidelity)
    if not records and not fidelity:
        raise ValueError(
            f"experiment {experiment!r} has no {'' if all_runs else 'FINISHED '}training runs"
            f"{f' in group {group!r}' if group else ''} nor fidelity runs ({describe_left_out(left_out)})"
        )
    out = Path(out_dir) if out_dir else Path("outputs") / "reports" / experiment
    tables, figures = write_report(records, out, experiment, fidelity, fidelity_left_out)
    run_id = attach_to_mlflow(client, experiment, out) if upload else None
    return ReportFiles(out_dir=out, tables=tables, figures=figures, n_runs=len(records), report_run_id=run_id,
                       left_out=left_out, n_fidelity_runs=len(fidelity), fidelity_left_out=fidelity_left_out)
