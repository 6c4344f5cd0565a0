"""`python -m progpo.report --experiment NAME`: the paper's tables and figures from the runs of one MLflow experiment.

Writes to ``--out`` (default ``outputs/reports/<experiment>``) and attaches the same files to a ``report`` run
in the experiment (tag ``progpo.kind=report``; re-running the report overwrites that run's artifacts):

- ``table1_success.md/.csv``: final held-out success per method, per task type (Table 1): mean ± sample std over
  seeds [95% t-interval of the mean over seeds]; the CSV has ``mean``, ``std``, ``ci95`` (half-width) and ``n``;
- ``table1_seeds.md/.csv``: every run's held-out success at its first and last evaluation and the change (the
  paired view: each seed's first evaluation samples its own episodes); ``table1_seeds_score.md/.csv`` the same for
  WebShop's purchase score (``val/score``) when runs log it;
- ``table2_credit.md/.csv``: mean over iterations of the ``credit/*`` diagnostics per method (Table 2);
- ``table3_ablation.md/.csv``: final training success per ablation variant, when runs carry an ``ablation`` tag
  (Table 3: measured on training rollouts, like the paper; an untagged ProGPO run counts as the variant its credit
  config is, ``full`` at the paper defaults);
- ``fig4_success_<env>.png``: success vs iteration per method, mean over seeds (Figure 4): held-out success as
  measured at each evaluation with ±1 std error bars over seeds; training success raw (light) and EMA-smoothed
  (decay 0.95, dark) with a ±1 std band when dense (``DENSE_MIN_POINTS`` points or more), else like held-out; a
  second row draws the purchase score the same way when runs log one (WebShop);
- ``fig5_credit_<env>.png``: ``credit/*`` shares vs iteration per method, EMA-smoothed when dense (raw
  transition-only faint), raw with markers otherwise (Figure 5);
- ``fig4_ablation_<env>.png``, ``fig5_ablation_<env>.png``: the same for the ablation variants, when the experiment
  holds both method runs and ablation runs.
- ``table4_fidelity.md/.csv``: credit fidelity (Table 4), from the experiment's ``python -m progpo.fidelity`` runs
  (tag ``progpo.kind=fidelity``; Tables 1-3 and Figures 4-5 never read them): per estimator (grpo, gigpo, hgpo,
  progpo, then the ProGPO variants) and measured policy (``fidelity.iteration``: the warm start, or a checkpoint
  after N iterations), the Spearman correlation and the sign agreement with the Monte-Carlo advantage, as mean ±
  sample std over seeds [95% t-interval over seeds] and n seeds, and the noise floor (what an exact estimator would
  score given the measurement noise); a seed measured twice at one policy counts once (its latest run);
  ``table4_fidelity_runs.csv`` one row per fidelity run x estimator with each run's point values and 95% bootstrap
  intervals over its measured steps;
- ``fig6_fidelity_<env>.png``: Table 4 drawn (Figure 6): mean Spearman and sign agreement per estimator, one bar
  per measured policy, the interval over seeds, each seed as a dot, each policy's noise floor dashed.

- ``runs.json``: the records behind the tables (final metrics, curves, tags; the fidelity runs' tags and
  ``fidelity/*`` metrics under ``fidelity``): the tracking store is local and
  git-ignored, so ``--records <folder>/runs.json`` rebuilds a committed report on any clone, and adds its runs to
  the store's (a run in both counts once) when new seeds are trained; ``report.md`` names the machines (tag
  ``machine``) the runs came from and warns when they differ.

Runs are grouped by ``method`` (the credit choice) plus ``[ablation]`` when set, and by ``env``; seeds are the runs
of a group (Table 4: by ``env``, estimator and measured policy). Only FINISHED runs count unless ``--all-runs``; the
report says how many it left out and in which state.
A RUNNING run whose process is gone (tag ``progpo.process``: same host, that process no longer runs; e.g. killed
with SIGKILL) is marked KILLED first. ``--group`` keeps the runs of one multirun or study.

The package: ``records`` (reading the runs), ``archive`` (``runs.json``), ``tables``, ``figures``, ``driver`` (``make_report``) and ``cli``
(``main``).
"""

from progpo.report.archive import (
    ARCHIVE_NAME,
    load_archive,
    load_fidelity_archive,
    merge_records,
    save_archive,
)
from progpo.report.cli import main
from progpo.report.driver import ReportFiles, attach_to_mlflow, make_report, write_report
from progpo.report.figures import (
    ABLATION_COLOURS,
    DENSE_MIN_POINTS,
    EMA_DECAY,
    METHOD_COLOURS,
    SeedCurve,
    credit_figure,
    ema,
    fidelity_figure,
    is_dense,
    mean_curve,
    seed_curve,
    success_figure,
)
from progpo.report.records import (
    ABLATION_ORDER,
    CREDIT_KEYS,
    CURVE_KEYS,
    LEFT_OUT_WHY,
    METHOD_ORDER,
    FidelityRecord,
    RunRecord,
    describe_left_out,
    load_fidelity_runs,
    load_runs,
)
from progpo.report.tables import (
    CELL_NOTE,
    FIDELITY_METRICS,
    NOISE_FLOOR,
    Cell,
    PolicyColumn,
    credit_table,
    fidelity_table,
    final_table,
    t975,
    to_csv,
    to_markdown,
)

__all__ = [
    "ABLATION_COLOURS",
    "ABLATION_ORDER",
    "ARCHIVE_NAME",
    "CELL_NOTE",
    "CREDIT_KEYS",
    "CURVE_KEYS",
    "DENSE_MIN_POINTS",
    "EMA_DECAY",
    "FIDELITY_METRICS",
    "LEFT_OUT_WHY",
    "METHOD_COLOURS",
    "METHOD_ORDER",
    "NOISE_FLOOR",
    "Cell",
    "FidelityRecord",
    "PolicyColumn",
    "ReportFiles",
    "RunRecord",
    "SeedCurve",
    "attach_to_mlflow",
    "credit_figure",
    "credit_table",
    "describe_left_out",
    "ema",
    "fidelity_figure",
    "fidelity_table",
    "final_table",
    "is_dense",
    "load_archive",
    "load_fidelity_archive",
    "load_fidelity_runs",
    "load_runs",
    "main",
    "make_report",
    "mean_curve",
    "merge_records",
    "save_archive",
    "seed_curve",
    "success_figure",
    "t975",
    "to_csv",
    "to_markdown",
    "write_report",
]
