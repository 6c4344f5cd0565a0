"""Run artifacts beyond scalars: trajectory tables, figures, checkpoint location.

Every helper takes the logger the trainer got from ``make_logger`` and is a no-op (with a debug message)
for ``None`` or a logger that is not MLflow, so the trainer can call them unconditionally.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

from progpo.tracking.retry import RetryPolicy, call_with_retry

log = logging.getLogger(__name__)

# Columns shown first in a trajectory table (others follow in first-seen order).
TRAJECTORY_COLUMNS = (
    "iteration",
    "group",
    "traj",
    "t",
    "task_id",
    "task_type",
    "prompt",
    "response",
    "action",
    "valid",
    "reward",
    "return",
    "advantage",
)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")


def _mlflow_call(logger: Any, what: str) -> Callable[..., Any] | None:
    """A retrying caller bound to ``logger``, or None when ``logger`` does not log to MLflow."""
    if logger is None or not isinstance(logger, MLFlowLogger):
        log.debug("%s skipped: logger %r is not an MLflow logger", what, type(logger).__name__)
        return None
    call = getattr(logger, "call", None)
    if call is not None:
        return lambda fn, *a, **kw: call(what, fn, *a, **kw)
    return lambda fn, *a, **kw: call_with_retry(fn, *a, what=what, policy=RetryPolicy(), **kw)


def _plain(value: Any) -> Any:
    """Tensors / numpy scalars to Python values, so the table serialises as JSON."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple, dict)):
        return str(value)
    return value


def trajectory_frame(rows: Sequence[Mapping[str, Any]], iteration: int):
    """The per-turn table as a DataFrame: known columns first, every value JSON-serialisable."""
    import pandas as pd

    columns: list[str] = ["iteration"]
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(str(key))
    ordered = [c for c in TRAJECTORY_COLUMNS if c in columns] + [c for c in columns if c not in TRAJECTORY_COLUMNS]
    records = [{"iteration": iteration, **{str(k): _plain(v) for k, v in row.items()}} for row in rows]
    return pd.DataFrame.from_records(records, columns=ordered)


def log_trajectories(logger: Any, rows: Sequence[Mapping[str, Any]], iteration: int) -> str | None:
    """Log sampled turns (prompt, response, action, valid, reward, advantage parts...) as an MLflow table.

    Written with ``mlflow.log_table`` to ``trajectories/iter_<iteration>.json`` (shown in the MLflow UI;
    ``pandas.read_json(path, orient="split")`` reads it back). Returns the artifact path, or None if skipped.
    """
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    call = _mlflow_call(logger, "log trajectories")
    if call is None or not rows:
        return None
    artifact = f"trajectories/iter_{iteration:06d}.json"
    frame = trajectory_frame(rows, iteration)
    call(logger.experiment.log_table, logger.run_id, data=frame, artifact_file=artifact)
    return artifact


def log_figure(logger: Any, fig: Any, name: str) -> str | None:
    """Log a matplotlib figure as ``plots/<name>.png`` of the run. Returns the artifact path, or None if skipped."""
    if not name:
        raise ValueError("log_figure: name must be a non-empty file name, e.g. 'success_curve'")
    call = _mlflow_call(logger, "log figure")
    if call is None:
        return None
    stem = _SAFE_NAME.sub("_", name)
    artifact = stem if Path(stem).suffix in (".png", ".svg", ".pdf", ".jpg") else f"{stem}.png"
    artifact = f"plots/{artifact}"
    call(logger.experiment.log_figure, logger.run_id, fig, artifact)
    return artifact


def log_checkpoint(logger: Any, path: str | Path, iteration: int | None = None) -> None:
    """Record a checkpoint's location (tags ``checkpoint_path`` and ``checkpoint_iteration``)."""
    call = _mlflow_call(logger, "log checkpoint path")
    if call is None:
        return
    tags = {"checkpoint_path": str(Path(path).resolve())}
    if iteration is not None:
        tags["checkpoint_iteration"] = str(iteration)
    for key, value in tags.items():
        call(logger.experiment.set_tag, logger.run_id, key, value)


def log_files(logger: Any, paths: Sequence[str | Path], artifact_dir: str | None = None) -> None:
    """Attach files (a report, a table, a data file) to the logger's run under ``artifact_dir``."""
    call = _mlflow_call(logger, "log artifact")
    if call is None:
        return
    for path in paths:
        call(logger.experiment.log_artifact, logger.run_id, str(path), artifact_dir)
