"""Trainer trials: the trial config (Hydra compose), ``OptunaTrialCallback`` and ``TrainerObjective``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from omegaconf import DictConfig, OmegaConf, open_dict

from progpo.config import CONF_DIR
from progpo.sweep.runner import SweepResult, run_sweep
from progpo.sweep.spec import SweepSpec, SweepSpecError

log = logging.getLogger(__package__)



class OptunaTrialCallback(L.Callback):
    """Lightning callback for one trial: links the MLflow run and prunes on the held-out metric.

    At setup the logger's run id becomes the trial's ``mlflow_run_id`` user attr; after each validation the
    evaluation's ``monitor`` value (from the step outputs) is reported at step = RL iterations done and
    ``optuna.TrialPruned`` raised when the pruner says so.
    """

    def __init__(self, trial: optuna.Trial, monitor: str = "val/success") -> None:
        self.trial = trial
        self.monitor = monitor
        self.run_id: str | None = None
        self.reported: dict[int, float] = {}

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        run_id = getattr(trainer.logger, "run_id", None) if trainer.logger is not None else None
        if run_id and run_id != self.run_id:
            self.run_id = run_id
            self.trial.set_user_attr("mlflow_run_id", run_id)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        result = outputs.get("result") if isinstance(outputs, dict) else None
        if getattr(trainer, "sanity_checking", False) or result is None or self.monitor not in result.metrics:
            return
        value, step = float(result.metrics[self.monitor]), int(result.iteration)
        if not math.isfinite(value) or step in self.reported:
            return
        self.reported[step] = value
        self.trial.report(value, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at iteration {step}: {self.monitor}={value:.4f}")


def _compose_with_hydra(spec: SweepSpec, overrides: Sequence[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(spec.config_dir).resolve() if spec.config_dir else CONF_DIR)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3", job_name=spec.study_name):
        return compose(config_name=spec.config_name, overrides=list(overrides), return_hydra_config=True)


def _compose(spec: SweepSpec, extra: Sequence[str]) -> DictConfig:
    """The sweep file's overrides, then the command line's ``extra``, which win on every key they change.

    Hydra applies ``key=value`` overrides after all config groups, so the sweep file's ``schedule.max_iterations=30``
    alone would beat the command line's ``experiment=fast_dev`` (which sets it to 1). Hence every key whose value
    ``extra`` changes (on top of the sweep file's config group choices) takes the value ``extra`` gives it.
    """
    from hydra.core.hydra_config import HydraConfig

    cfg = _compose_with_hydra(spec, [*spec.overrides, *extra])
    if extra:
        choices = cfg.hydra.runtime.choices
        groups = [o for o in spec.overrides if o.split("=", 1)[0].lstrip("+~").split("@", 1)[0] in choices]
        before = _leaves(_compose_with_hydra(spec, groups))
        after = _leaves(_compose_with_hydra(spec, [*groups, *extra]))
        with open_dict(cfg):
            for key, value in after.items():
                if key.split(".", 1)[0] != "hydra" and before.get(key, _MISSING) != value:
                    OmegaConf.update(cfg, key, value, merge=False)
    HydraConfig.instance().set_config(cfg)  # runtime.choices feed the run's method/env/model tags
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


_MISSING = object()


def _leaves(cfg: DictConfig) -> dict[str, Any]:
    """Dotted key -> unresolved value of every leaf (lists count as leaves)."""
    out: dict[str, Any] = {}

    def visit(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                visit(f"{prefix}{key}.", value)
        else:
            out[prefix[:-1]] = node

    visit("", OmegaConf.to_container(cfg, resolve=False))
    return out


def trial_config(spec: SweepSpec, values: Mapping[str, Any], number: int, extra: Sequence[str] = ()) -> DictConfig:
    """The trainer config of one trial: sweep file overrides, CLI overrides (winning), sampled values, run settings.

    The run is named ``<credit>-<env>-<model>-seed<seed>-trial<number>`` (MLflow run and ``run_name``).
    """
    from progpo.runs import default_run_name

    cfg = _compose(spec, extra)
    with open_dict(cfg):
        for key, value in values.items():
            if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
                raise SweepSpecError(
                    f"search_space key {key!r} is not in the trainer config (credit "
                    f"{cfg.credit.get('_target_', '?')}); check the name against conf/"
                )
            OmegaConf.update(cfg, key, value, merge=False)
        if "objective" in cfg:
            cfg.objective = spec.objective
        run_name = f"{default_run_name(cfg)}-trial{number}"
        cfg.run_name = run_name
        cfg.run_dir = str(Path(spec.output_dir) / spec.study_name / f"trial_{number:04d}")
        if cfg.get("logger") is not None and "experiment_name" in cfg.logger:
            cfg.logger.experiment_name = spec.experiment_name
            cfg.logger.group = spec.study_name
            cfg.logger.run_id = None
            tags = dict(cfg.logger.get("tags") or {})
            tags.update({"optuna.study_name": spec.study_name, "optuna.trial_number": str(number)})
            cfg.logger.tags = tags
    return cfg


def check_trainer_config(spec: SweepSpec, extra: Sequence[str] = ()) -> None:
    """Compose and validate one trial config before any trial exists: a bad override fails the sweep at once."""
    from progpo.config import validate_config

    point = {}
    for p in spec.search_space:
        point[p.name] = p.choices[0] if p.type == "categorical" else (int(p.low) if p.type == "int" else p.low)
    validate_config(trial_config(spec, point, 0, extra))


class TrainerObjective:
    """The objective of a trainer sweep: one ``progpo.train.train`` run per trial."""

    def __init__(self, spec: SweepSpec, extra_overrides: Sequence[str] = ()) -> None:
        self.spec = spec
        self.extra = tuple(extra_overrides)

    def __call__(self, trial: optuna.Trial) -> float:
        from progpo.train import train

        values = {p.name: p.suggest(trial) for p in self.spec.search_space}
        cfg = trial_config(self.spec, values, trial.number, self.extra)
        trial.set_user_attr("run_dir", str(cfg.run_dir))
        uri = str(cfg.logger.tracking_uri) if cfg.get("logger") is not None and "tracking_uri" in cfg.logger else None
        if uri:
            trial.set_user_attr("mlflow_tracking_uri", uri)
        callback = OptunaTrialCallback(trial, monitor=self.spec.monitor)
        try:
            metrics, _ = train(cfg, callbacks=[callback])
        except optuna.TrialPruned:
            raise
        except Exception as error:
            if uri and callback.run_id is None:  # failed before the logger started: record the attempt anyway
                self._record_unlogged_failure(trial, uri, str(cfg.run_name), values, error)
            raise
        if self.spec.objective not in metrics:
            raise KeyError(f"objective {self.spec.objective!r} is not among the run's metrics: {sorted(metrics)}")
        return float(metrics[self.spec.objective])

    def run(self) -> SweepResult:
        """The study: ``run_sweep`` with this objective and its MLflow mirroring."""
        return run_sweep(self.spec, self, after_trial=self.after_trial, after_killed=self.after_killed)

    def _record_unlogged_failure(self, trial: optuna.Trial, uri: str, run_name: str, values: Mapping[str, Any],
                                 error: Exception) -> None:
        try:
            from mlflow import MlflowClient

            from progpo.tracking import ensure_experiment

            client = MlflowClient(uri)
            experiment_id = ensure_experiment(client, self.spec.experiment_name, uri)
            run = client.create_run(
                experiment_id,
                run_name=run_name,
                tags={"optuna.study_name": self.spec.study_name, "optuna.trial_number": str(trial.number),
                      "group": self.spec.study_name, "progpo.kind": "train",
                      "error": f"{type(error).__name__}: {error}"[:5000]},
            )
            for key, value in values.items():
                client.log_param(run.info.run_id, key, value)
            trial.set_user_attr("mlflow_run_id", run.info.run_id)
        except Exception as mlflow_error:  # bookkeeping only
            log.warning("could not record failed trial %d in MLflow: %s", trial.number, mlflow_error)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Mirror the trial's outcome on its MLflow run: tags optuna.state/value, status FINISHED/KILLED/FAILED."""
        status = {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}.get(trial.state.name, "FAILED")
        self._mirror(trial, status)

    def after_killed(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """A dead worker's trial (FAIL in Optuna): its MLflow run, left RUNNING by the killed process, ends KILLED."""
        self._mirror(trial, "KILLED")

    def _mirror(self, trial: optuna.trial.FrozenTrial, status: str) -> None:
        uri, run_id = trial.user_attrs.get("mlflow_tracking_uri"), trial.user_attrs.get("mlflow_run_id")
        if not uri or not run_id:
            return
        try:
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            client.set_tag(run_id, "optuna.state", trial.state.name)
            if trial.value is not None:
                client.set_tag(run_id, "optuna.value", str(trial.value))
            client.set_terminated(run_id, status)
        except Exception as error:  # bookkeeping only: never stop the study for it
            log.warning("could not update the MLflow run of trial %d: %s", trial.number, error)
