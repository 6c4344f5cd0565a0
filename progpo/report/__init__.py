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

The package: ``records`` (reading the runs), ``tables``, ``figures``, ``driver`` (``make_report``) and ``cli``
(``main``).
"""

from progpo.report.cli import main
from progpo.report.driver import ReportFiles, attach_to_mlflow, make_report, write_report
from progpo.report.figures import (
    ABLATION_COLOURS,
    EMA_DECAY,
    METHOD_COLOURS,
    credit_figure,
    ema,
    mean_curve,
    success_figure,
)
from progpo.report.records import (
    ABLATION_ORDER,
    CREDIT_KEYS,
    CURVE_KEYS,
    LEFT_OUT_WHY,
    METHOD_ORDER,
    RunRecord,
    describe_left_out,
    load_runs,
)
from progpo.report.tables import Cell, credit_table, final_table, to_csv, to_markdown

__all__ = [
    "ABLATION_COLOURS",
    "ABLATION_ORDER",
    "CREDIT_KEYS",
    "CURVE_KEYS",
    "EMA_DECAY",
    "LEFT_OUT_WHY",
    "METHOD_COLOURS",
    "METHOD_ORDER",
    "Cell",
    "ReportFiles",
    "RunRecord",
    "attach_to_mlflow",
    "credit_figure",
    "credit_table",
    "describe_left_out",
    "ema",
    "final_table",
    "load_runs",
    "main",
    "make_report",
    "mean_curve",
    "success_figure",
    "to_csv",
    "to_markdown",
    "write_report",
]
