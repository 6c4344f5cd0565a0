"""Experiment tracking in MLflow: the trainer's logger and helpers for tables, figures and checkpoints."""

from progpo.tracking.artifacts import (
    log_checkpoint,
    log_figure,
    log_files,
    log_trajectories,
    trajectory_frame,
)
from progpo.tracking.mlflow_logger import (
    EXPERIMENT_KIND_TAG,
    KIND_TAG,
    ProGPOMLFlowLogger,
    TrackingUnavailableError,
    check_tracking_uri,
    default_artifact_location,
    ensure_experiment,
    make_logger,
    run_status,
)
from progpo.tracking.retry import RetryPolicy, call_with_retry
from progpo.tracking.run_info import PROCESS_TAG, derive_tags, flatten_params, git_info, process_is_gone

__all__ = [
    "EXPERIMENT_KIND_TAG",
    "KIND_TAG",
    "PROCESS_TAG",
    "ProGPOMLFlowLogger",
    "RetryPolicy",
    "TrackingUnavailableError",
    "call_with_retry",
    "check_tracking_uri",
    "default_artifact_location",
    "derive_tags",
    "ensure_experiment",
    "flatten_params",
    "git_info",
    "log_checkpoint",
    "log_figure",
    "log_files",
    "log_trajectories",
    "make_logger",
    "process_is_gone",
    "run_status",
    "trajectory_frame",
]
