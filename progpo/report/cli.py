"""`python -m progpo.report --experiment NAME`: the paper's tables and figures from the runs of one MLflow experiment.

The command line of ``python -m progpo.report``; see the package doc.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from progpo.report.driver import make_report
from progpo.report.records import describe_left_out

log = logging.getLogger(__package__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m progpo.report", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", required=True, help="MLflow experiment name (logger.experiment_name)")
    parser.add_argument("--out", default=None, help="output folder (default outputs/reports/<experiment>)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///outputs/mlflow.db)")
    parser.add_argument("--group", default=None, help="only runs with this `group` tag (one multirun or study)")
    parser.add_argument("--all-runs", action="store_true", help="include runs that did not finish")
    parser.add_argument("--records", action="append", default=[], metavar="RUNS_JSON",
                        help="an earlier report's runs.json: its runs join the store's (a run in both counts "
                             "once); the store may lack the experiment; repeatable")
    parser.add_argument("--no-upload", action="store_true", help="do not attach the report to MLflow")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        files = make_report(opts.experiment, opts.out, opts.tracking_uri, opts.group, opts.all_runs,
                            upload=not opts.no_upload, archives=opts.records)
    except ValueError as error:
        log.error("%s", error)
        return 2
    print((files.out_dir / "report.md").read_text())  # noqa: T201 - CLI output
    fidelity = (f"; {files.n_fidelity_runs} fidelity run(s) (Table 4), {describe_left_out(files.fidelity_left_out)}"
                if files.n_fidelity_runs or files.fidelity_left_out else "")
    print(f"wrote {len(files.tables)} tables and {len(files.figures)} figures to {files.out_dir} from "  # noqa: T201
          f"{files.n_runs} FINISHED run(s); {describe_left_out(files.left_out)}{fidelity}"
          + (f"; MLflow report run {files.report_run_id}" if files.report_run_id else ""))
    return 0
