"""The MLflow logger the trainer gets from ``conf/logger/mlflow.yaml``.

A Lightning ``MLFlowLogger`` that (1) checks the store at start and fails at once with a message naming
``logger.tracking_uri``, (2) creates the run eagerly so its id can go into checkpoints, (3) records the
resolved config, git commit and grouping tags, (4) retries every later call with backoff and only warns
when the store stays unreachable, so tracking problems never end a training run, and (5) lets the run's MLflow
status follow its life: RUNNING while it trains, FAILED when it raises, FINISHED only when the trainer says the run
is complete (``end_run``; see ``run_status``), never on Lightning's end-of-stage ``finalize("success")``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf
from typing_extensions import override

from progpo.config.groups import ConfigError
from progpo.tracking.locks import file_lock
from progpo.tracking.retry import RetryPolicy, call_with_retry
from progpo.tracking.run_info import (
    MAX_TAG_VALUE_LENGTH,
    PROCESS_TAG,
    clip,
    derive_tags,
    flatten_params,
    git_info,
    process_id,
    to_container,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

KIND_TAG = "progpo.kind"  # "train" for training runs, "fidelity" for credit-fidelity measurements, "report" for the report run of an experiment
# The experiment tag by which MLflow's UI tells a classic ML experiment (runs table) from a GenAI app (overview,
# traces): values genai_development | custom_model_development (mlflow/server/js). MLflow 3.17.2's experiment page
# does not read it, though: it follows the browser's "GenAI | Model training" switch (default GenAI) or the URL
# parameter `workflowType=machine_learning` (see scripts/mlflow_ui_screenshot.sh).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
RUN_END_STATUSES = ("FINISHED", "FAILED", "KILLED")


class TrackingUnavailableError(ConfigError, RuntimeError):
    """The tracking store cannot be used at start (unreachable server, bad URI, missing run): bad input, exit 2."""


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///...`` URI (None for in-memory databases)."""
    rest = uri[len("sqlite://") :]  # "/relative.db" or "//absolute.db"
    if not rest.startswith("/") or rest in ("/", "/:memory:"):
        return None
    return Path(rest[1:].split("?", 1)[0])


def check_tracking_uri(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast (within ``timeout_s``) when an HTTP tracking server does not answer; prepare sqlite folders."""
    scheme = urlparse(tracking_uri).scheme
    if scheme in ("http", "https"):
        url = tracking_uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                status = response.status
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            raise TrackingUnavailableError(
                f"MLflow tracking server at logger.tracking_uri={tracking_uri!r} is not reachable ({error}). "
                "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or point logger.tracking_uri / "
                "MLFLOW_TRACKING_URI at a running server or at sqlite:///outputs/mlflow.db."
            ) from error
        if status != 200:
            raise TrackingUnavailableError(
                f"MLflow tracking server at logger.tracking_uri={tracking_uri!r} answered /health with {status}"
            )
    elif scheme == "sqlite":
        path = _sqlite_path(tracking_uri)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            create_sqlite_store(tracking_uri, path)


def create_sqlite_store(tracking_uri: str, path: Path) -> None:
    """Create (or migrate) the sqlite store under a file lock beside it. MLflow builds its tables on first use;
    two processes doing it at once (two jobs of a parallel multirun on a fresh store) broke one of them with
    alembic's "Online migration expected to match one row"."""
    from mlflow import MlflowClient

    with file_lock(path.with_name(path.name + ".lock")):
        MlflowClient(tracking_uri).search_experiments(max_results=1)


def default_artifact_location(tracking_uri: str, experiment_name: str) -> str | None:
    """``<folder of the .db>/mlartifacts/<experiment>`` for a sqlite store, so that artifacts stay with their store.

    MLflow's own default for a sqlite store is ``./mlruns`` in the working directory of whoever created the
    experiment. Other stores (a server, PostgreSQL) decide themselves: None.
    """
    if urlparse(tracking_uri).scheme != "sqlite":
        return None
    path = _sqlite_path(tracking_uri)
    if path is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", experiment_name)
    return (path.resolve().parent / "mlartifacts" / folder).as_uri()


def ensure_experiment(client: Any, name: str, tracking_uri: str, artifact_location: str | None = None) -> str:
    """Id of the named experiment, created if missing (another process may create it at the same moment).

    A new experiment gets ``artifact_location`` (default: ``default_artifact_location``) and, like an existing one
    without it, the experiment kind tag of a classic ML experiment (``EXPERIMENT_KIND_TAG``).
    """
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage == "deleted":
        raise TrackingUnavailableError(
            f"MLflow experiment {name!r} is deleted; restore it in the MLflow UI or choose another "
            "logger.experiment_name"
        )
    if found is None:
        location = artifact_location or default_artifact_location(tracking_uri, name)
        try:
            experiment_id = client.create_experiment(name, artifact_location=location,
                                                     tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            log.info("created MLflow experiment %r (artifacts: %s)", name, location or "the server's default")
            return experiment_id
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if EXPERIMENT_KIND_TAG not in found.tags:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return found.experiment_id


class ProGPOMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` with eager run creation, resume, retries, and param de-duplication.

    Args:
        experiment_name: MLflow experiment (one per study / multirun family).
        tracking_uri: any MLflow tracking URI (``sqlite:///...``, ``http://host:port``, ...).
        run_name: display name of the run.
        run_id: continue this existing run instead of creating one (resume from a checkpoint).
        tags: tags set on the run (merged over existing tags on resume).
        retry: how failed calls are retried after start.
        artifact_location: artifact root for a newly created experiment (None: next to a sqlite store, else the
            server decides).

    Lightning calls ``finalize("success")`` at the end of every ``trainer.validate`` and ``trainer.fit``, so that
    call does not end the run; ``finalize("failed")`` (an exception inside Lightning) ends it FAILED, and the trainer
    ends a complete run with ``end_run("FINISHED")`` after its final evaluation. A run whose process is killed stays
    RUNNING (with the ``progpo.process`` tag that lets ``progpo.report`` see that its process is gone).
    """

    def __init__(
        self,
        *,
        experiment_name: str,
        tracking_uri: str,
        run_name: str | None = None,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        artifact_location: str | None = None,
    ) -> None:
        super().__init__(
            experiment_name=experiment_name,
            run_name=run_name,
            tracking_uri=tracking_uri,
            tags=dict(tags or {}),
            artifact_location=artifact_location,
            run_id=run_id,
        )
        self.retry = retry or RetryPolicy()
        self.resumed = run_id is not None
        self._logged_params: dict[str, str] = {}

    @property
    def tracking_uri(self) -> str:
        return self._tracking_uri

    @property
    def client(self):  # -> mlflow.MlflowClient (typed loosely: mlflow is imported lazily by Lightning)
        return self.experiment

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """Run one tracking call with retries; returns None (and warns) if it keeps failing."""
        return call_with_retry(fn, *args, what=what, policy=self.retry, **kwargs)

    def start(self) -> str:
        """Create (or attach to) the run now, so that start-up problems surface before training begins."""
        from mlflow.exceptions import MlflowException

        try:
            if not self.resumed:
                self._experiment_id = self._ensure_experiment()
            _ = self.experiment
        except MlflowException as error:
            if self.resumed and getattr(error, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                raise TrackingUnavailableError(
                    f"logger.run_id={self._run_id!r} does not exist in logger.tracking_uri={self._tracking_uri!r}; "
                    "resume with the store the run was logged to, or set logger.run_id=null for a new run"
                ) from error
            raise
        if self.resumed:
            run = self.client.get_run(self._run_id)
            self._logged_params = dict(run.data.params)
            log.info("continuing MLflow run %s (%s until now)", self._run_id, run.info.status)
            self.client.update_run(self._run_id, status="RUNNING")
            if self.tags:
                self.set_tags(self.tags)
        self.set_tags({PROCESS_TAG: process_id()})
        return self._run_id

    def _ensure_experiment(self) -> str:
        return ensure_experiment(self._mlflow_client, self._experiment_name, self._tracking_uri,
                                 self._artifact_location)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        run_tags = [RunTag(str(k), clip(str(v), MAX_TAG_VALUE_LENGTH)) for k, v in tags.items()]
        for idx in range(0, len(run_tags), 100):
            self.call("set tags", self.client.log_batch, run_id=self.run_id, tags=run_tags[idx : idx + 100])

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Log params once: repeated identical values are skipped; changed values are warned about, not raised."""
        from mlflow.entities import Param

        flat = flatten_params(params if isinstance(params, Mapping) else vars(params))
        new: list[Param] = []
        for key, value in flat.items():
            old = self._logged_params.get(key)
            if old is None:
                new.append(Param(key, value))
            elif old != value:
                log.warning("MLflow params are immutable: keeping %s=%r (new value %r is only in the config YAML)",
                            key, old, value)
        for idx in range(0, len(new), 100):
            chunk = new[idx : idx + 100]
            done = self.call("log params", lambda c=chunk: self.client.log_batch(run_id=self.run_id, params=c) or True)
            if done:
                self._logged_params.update({p.key: p.value for p in chunk})

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.call("log metrics", super().log_metrics, metrics, step)

    @override
    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Lightning's end-of-stage hook: only a failure ends the run here (see the class doc)."""
        if status == "failed":
            self.end_run("FAILED")
        else:
            log.debug("MLflow run %s stays RUNNING after Lightning's finalize(%r)", self._run_id, status)

    @rank_zero_only
    def end_run(self, status: str = "FINISHED", error: BaseException | None = None) -> None:
        """End the MLflow run as FINISHED (complete, after the final evaluation), FAILED or KILLED.

        ``error`` (the exception that ended the run) is recorded as the ``error`` tag.
        """
        if status not in RUN_END_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_END_STATUSES)}, got {status!r}")
        if error is not None:
            self.set_tags({"error": f"{type(error).__name__}: {error}"})
        self.call("end run", self.client.set_terminated, self.run_id, status)

    @override
    def log_config(self, cfg: Any, artifact_file: str = "config/config.yaml") -> None:
        """The resolved config as a YAML artifact (the complete record; params are a flattened, clipped view)."""
        text = OmegaConf.to_yaml(OmegaConf.create(to_container(cfg)))
        self.call("log config", self.client.log_text, self.run_id, text, artifact_file)


@contextlib.contextmanager
def run_status(logger: Any) -> Iterator[None]:
    """End ``logger``'s run with the outcome of the block: FINISHED when it returns, KILLED on ``KeyboardInterrupt``
    or ``SystemExit`` (Lightning turns Ctrl+C and SIGTERM into ``SystemExit``), FAILED on any other exception.

    A no-op for ``None`` and loggers without ``end_run`` (``logger=none``). Put the whole run in the block, the
    final evaluation included::

        with run_status(logger):
            trainer.fit(...)
            trainer.validate(...)
    """
    end_run = getattr(logger, "end_run", None)
    try:
        yield
    except BaseException as error:
        if end_run is not None:
            end_run("KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED", error)
        raise
    if end_run is not None:
        end_run("FINISHED")


def make_logger(
    cfg: Any,
    tracking_uri: str,
    experiment_name: str = "progpo",
    run_name: str | None = None,
    run_id: str | None = None,
    group: str | None = None,
    tags: Mapping[str, Any] | None = None,
    retries: int = 3,
    backoff_s: float = 0.5,
    connect_timeout_s: float = 5.0,
    artifact_location: str | None = None,
    log_config: bool = True,
) -> ProGPOMLFlowLogger:
    """Hydra target of ``conf/logger/mlflow.yaml``: a started MLflow logger for the run described by ``cfg``.

    The run is named ``run_name`` (a Python caller's), else ``cfg.run_name``, which the trainer fills with
    :func:`progpo.runs.run_name`, the name of the run's folder too.
    Fails at once with ``TrackingUnavailableError`` if the store named by ``logger.tracking_uri`` cannot be used.
    Tags: method/env/model/experiment/ablation (Hydra choices), seed, group (``group``, else the multirun's sweep
    dir, else the experiment name), git commit/branch/dirty, ``progpo.kind=train``; ``tags`` override them.
    """
    if not tracking_uri:
        raise ValueError("logger.tracking_uri is empty; set it (or MLFLOW_TRACKING_URI), e.g. sqlite:///outputs/mlflow.db")
    if not experiment_name:
        raise ValueError("logger.experiment_name is empty; name the MLflow experiment, e.g. logger.experiment_name=progpo")
    policy = RetryPolicy(retries=int(retries), backoff_s=float(backoff_s))
    check_tracking_uri(tracking_uri, timeout_s=float(connect_timeout_s))

    git = git_info()
    run_tags = derive_tags(cfg, experiment_name, group)
    run_tags.update(
        {
            "mlflow.source.git.commit": git.commit,
            "git_commit": git.commit,
            "git_branch": git.branch,
            "git_dirty": str(git.dirty).lower(),
            KIND_TAG: "train",
        }
    )
    run_tags.update({str(k): str(v) for k, v in (tags or {}).items()})
    logger = ProGPOMLFlowLogger(
        experiment_name=experiment_name,
        tracking_uri=tracking_uri,
        run_name=run_name or _config_run_name(cfg),
        run_id=run_id,
        tags=run_tags,
        retry=policy,
        artifact_location=artifact_location,
    )
    # Creating the run is retried (sqlite locks while several processes create one database), then fatal.
    last_error: Exception | None = None
    for attempt in range(policy.retries + 1):
        try:
            logger.start()
            break
        except TrackingUnavailableError:
            raise
        except Exception as error:
            last_error = error
            time.sleep(policy.delay(attempt))
    else:
        raise TrackingUnavailableError(
            f"cannot start an MLflow run at logger.tracking_uri={tracking_uri!r} "
            f"(experiment {experiment_name!r}): {type(last_error).__name__}: {last_error}"
        ) from last_error
    logger.log_hyperparams(to_container(cfg))
    if log_config:
        artifact = "config/config.yaml" if not logger.resumed else f"config/config-resume-{int(time.time())}.yaml"
        logger.log_config(cfg, artifact)
    log.info("MLflow run %s in experiment %r at %s", logger.run_id, experiment_name, tracking_uri)
    return logger


def _config_run_name(cfg: Any) -> str | None:
    name = cfg.get("run_name") if isinstance(cfg, Mapping) else None
    return str(name) if name else None
