"""Fidelity sweeps: an Optuna study of the credit hyperparameters whose objective is credit fidelity on saved truth
files (``python -m progpo.fidelity``) instead of training. A trial takes milliseconds, so a study has thousands.

    python -m progpo.fidelity experiment=laptop_alfworld fidelity.save=outputs/fidelity/tune0/truth.npz  # truth files
    python -m progpo.sweep sweeps/progpo_fidelity.yaml
    python -m progpo.sweep sweeps/progpo_fidelity.yaml n_trials=4000 objective=sign_agreement study_name=fid_sign

A sweep file with a ``fidelity:`` section (``sweeps/progpo_fidelity.yaml``, ``spec.FidelitySpec``) selects
``FidelityObjective`` (the one switch is in ``cli.main``). A trial builds the estimator from the trainer config exactly
as a trainer trial composes it (the sweep file's ``overrides``, the command line's ``--`` overrides, the sampled
values; ``credit.history`` interpolates ``rollout.history``), instantiates ``cfg.credit`` and returns the mean over
``fidelity.truth`` of ``objective``, a key of ``point_metrics``. Composing costs 0.17-0.22 s, more than a whole trial
(~70-100 ms, mostly Optuna's storage and TPE), so the config is composed once and a trial only sets the sampled keys
on it (2.4 ms with ``instantiate``; every trial sets all of them, so nothing carries over from the last one). The
tests check that this builds the estimator ``trial_config`` builds.

After the study, ``judge`` scores the best trial's setting and the defaults (the first enqueued point: the paper's
values) on ``fidelity.truth`` and on ``fidelity.holdout``, with a 95% paired bootstrap interval of (best - defaults)
over the steps (each file's steps resampled alike for both settings, averaged over files): thousands of settings tuned
on a few batches fit their noise too, and the holdout column, never seen by the sampler, says how much of the gain
is real. Both go to the log as a table, to the result, to MLflow and to ``<output_dir>/<study_name>/judgement.md``.

Tracking: one MLflow run per invocation, not one per trial. Measured on the project's busy two-core machine with a
sqlite store: an MLflow run per trial (create, one ``log_batch`` of params and metrics, terminate) costs ~100 ms,
more than the trial; metrics of ``FLUSH_TRIALS`` trials per ``log_batch`` cost 1-2 ms a trial. So the run (tags
``progpo.kind=fidelity_sweep``, ``optuna.study_name``) holds every trial of this process as metrics
``trial/<metric>`` at step = trial number, the best params as params ``best/<key>`` (and ``defaults/<key>``), the
judgement as metrics ``{tuned,holdout}/{best,defaults}/<metric>`` and ``{tuned,holdout}/best_minus_defaults/<metric>``
(with ``_low``/``_high``), and the artifacts ``trials.csv`` (every trial of the study: state, value, params, metrics)
and ``judgement.md``. Each Optuna trial holds its metrics and the run's id as user attrs (``metrics``,
``mlflow_run_id``; no measurable cost). The study shows a progress bar instead of a log line per trial.

Measured (busy two-core machine, sqlite Optuna and MLflow stores, 2 tuned + 1 holdout files of ~2,400 steps with 200
measured each): 2000 trials in 171 s, 11.7 trials/s (16/s at first, 10/s by trial 2000 as TPE's history grows),
MLflow 1.3 ms a trial. Before the sqlite storage ran in WAL mode (``study.make_storage``) the same sweep did 3.4
trials/s.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from omegaconf import DictConfig, OmegaConf, open_dict

from progpo.credit import StepBatch
from progpo.fidelity import METRICS, FidelityTruth, Interval, Scores, point_metrics, score
from progpo.sweep.runner import SweepResult, run_sweep
from progpo.sweep.spec import FidelitySpec, SweepSpec, SweepSpecError
from progpo.sweep.trial import trial_config

log = logging.getLogger(__package__)

KIND = "fidelity_sweep"  # ``progpo.kind`` of the run (``fidelity`` is one measurement, read by ``progpo.report``)
FLUSH_TRIALS = 100  # trials whose metrics go to MLflow in one call
SETTINGS = ("defaults", "best")


@dataclass
class TruthFiles:
    """Truth files of one key (``fidelity.truth`` or ``fidelity.holdout``), loaded, with their step batches built once
    (a batch's layout is shared by every estimator call)."""

    key: str
    paths: tuple[str, ...]
    truths: list[FidelityTruth]
    batches: list[StepBatch]

    @classmethod
    def load(cls, key: str, paths: Sequence[str]) -> TruthFiles:
        truths = []
        for i, path in enumerate(paths):
            try:
                truths.append(FidelityTruth.load(path))
            except FileNotFoundError:
                raise SweepSpecError(
                    f"{key}[{i}]: no truth file at {path}; measure one with python -m progpo.fidelity "
                    f"experiment=<experiment> [ckpt_path=<checkpoint>] fidelity.save={path}"
                ) from None
            except (OSError, ValueError, KeyError) as error:
                raise SweepSpecError(f"{key}[{i}]: cannot read the truth file {path}: {error}") from error
        return cls(key, tuple(paths), truths, [t.step_batch() for t in truths])

    @property
    def steps(self) -> int:
        return sum(len(t.steps) for t in self.truths)

    def metrics(self, estimator: Any) -> dict[str, float]:
        """Each metric's mean over the files (a file where a sign metric is undefined, with no step whose truth's
        sign is known, is left out of that metric's mean)."""
        return _mean([point_metrics(t, estimator, b) for t, b in zip(self.truths, self.batches)])

    def advantages(self, estimator: Any) -> list[np.ndarray]:
        """The estimator's advantages on every file's measured steps."""
        return [t.estimates(estimator, b) for t, b in zip(self.truths, self.batches)]


def _mean(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: the metric is NaN
        return {m: float(np.nanmean([row[m] for row in rows])) for m in METRICS}


@dataclass(frozen=True)
class Comparison:
    """Both settings on one set of truth files: each metric's mean over the files, and best - defaults with its 95%
    paired bootstrap interval (the same resamples of each file's steps for both settings)."""

    files: tuple[str, ...]
    steps: int
    defaults: dict[str, float]
    best: dict[str, float]
    difference: dict[str, Interval]


@dataclass(frozen=True)
class Judgement:
    """The best trial's setting against the defaults, on the tuned files and on the holdout files (None: none)."""

    objective: str
    best_trial: int
    settings: dict[str, dict[str, Any]]  # "defaults" / "best" -> search-space key -> value
    tuned: Comparison
    holdout: Comparison | None


@dataclass(frozen=True)
class FidelitySweepResult:
    """What ``python -m progpo.sweep`` prints for a fidelity sweep."""

    sweep: SweepResult
    judgement: Judgement | None
    mlflow_run_id: str | None
    timing: dict[str, float] = field(default_factory=dict)


def compare(files: TruthFiles, defaults: Any, best: Any, resamples: int, seed: int = 0) -> Comparison:
    """Both estimators on ``files``; the paired interval resamples each file's steps and averages over files."""
    per_file: list[Scores] = []
    for k, (truth, a_def, a_best) in enumerate(zip(files.truths, files.advantages(defaults), files.advantages(best))):
        per_file.append(score({"defaults": a_def, "best": a_best}, truth.a_hat, truth.se, resamples, seed + k))
    means = {name: _mean([{m: s.values[name][m].value for m in METRICS} for s in per_file]) for name in SETTINGS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rows = {name: {m: np.nanmean([s.rows[name][m] for s in per_file], axis=0) for m in METRICS}
                for name in SETTINGS}
    nan = float("nan")
    merged = Scores(files.steps, {name: {m: Interval(means[name][m], nan, nan) for m in METRICS} for name in SETTINGS},
                    rows)
    return Comparison(files.paths, files.steps, means["defaults"], means["best"],
                      {m: merged.paired("best", "defaults", m) for m in METRICS})


class FidelityObjective:
    """The objective of a sweep file with a ``fidelity:`` section (see the module doc). Construction loads and checks
    everything (truth files, search space, the defaults' estimator on every file), so bad input fails before a trial.
    """

    def __init__(self, spec: SweepSpec, extra_overrides: Sequence[str] = ()) -> None:
        if spec.fidelity is None:
            raise SweepSpecError("a fidelity sweep needs a fidelity section: {truth: [files], holdout: [files]}")
        self.spec = spec
        self.fidelity: FidelitySpec = spec.fidelity
        self.tuned = TruthFiles.load("fidelity.truth", self.fidelity.truth)
        self.holdout = TruthFiles.load("fidelity.holdout", self.fidelity.holdout) if self.fidelity.holdout else None
        self.cfg = trial_config(spec, {}, 0, extra_overrides)
        self.defaults = self._defaults()
        self.uri = self._tracking_uri()
        self._check_gamma()
        try:
            self.estimator(self.defaults)(self.tuned.batches[0])
        except Exception as error:
            raise SweepSpecError(f"the defaults {self.defaults} do not build a working estimator on "
                                 f"{self.tuned.paths[0]}: {type(error).__name__}: {error}") from error
        self.metrics: dict[int, dict[str, float]] = {}  # trial -> metrics, until its ``after_trial``
        self.finished: list[optuna.trial.FrozenTrial] = []  # this process's trials (the table of a storage-less study)
        self.mlflow: StudyRun | None = None

    def _defaults(self) -> dict[str, Any]:
        """The first enqueued point (the paper's values), completed by the config's values; every key checked."""
        credit = OmegaConf.to_yaml(self.cfg.credit)  # unresolved: shows what credit interpolates
        point = {}
        for param in self.spec.search_space:
            value = OmegaConf.select(self.cfg, param.name, default="__missing__")
            if value == "__missing__":
                raise SweepSpecError(f"search_space.{param.name} is not in the trainer config; check the name "
                                     f"against conf/")
            if not (param.name.startswith("credit.") or "${" + param.name + "}" in credit):
                raise SweepSpecError(f"search_space.{param.name} does not change the credit estimator (cfg.credit "
                                     f"neither holds nor interpolates it); a fidelity sweep tunes credit.* and the keys "
                                     f"credit interpolates (rollout.history)")
            point[param.name] = value
        return {**point, **(self.spec.enqueue[0] if self.spec.enqueue else {})}

    def _tracking_uri(self) -> str | None:
        logger = self.cfg.get("logger")
        if logger is None or "tracking_uri" not in logger:
            return None  # logger=none: no MLflow
        from progpo.tracking import check_tracking_uri

        uri = str(logger.tracking_uri)
        check_tracking_uri(uri)  # an unreachable server fails here, before the study
        return uri

    def _check_gamma(self) -> None:
        """A truth measured with another discount than the estimator's is still scored, but say so."""
        gamma = OmegaConf.select(self.cfg, "credit.gamma", default=None)
        for files in [f for f in (self.tuned, self.holdout) if f is not None]:
            for path, truth in zip(files.paths, files.truths):
                measured = truth.meta.get("gamma")
                if gamma is not None and measured is not None and not math.isclose(float(measured), float(gamma)):
                    log.warning("%s measured returns with gamma=%s, the estimator discounts with credit.gamma=%s",
                                path, measured, gamma)

    def estimator(self, values: Mapping[str, Any]) -> Any:
        """The credit estimator of the trainer config with ``values`` set (interpolations such as ``credit.history``
        resolve against them)."""
        from hydra.utils import instantiate

        with open_dict(self.cfg):
            for key, value in values.items():
                OmegaConf.update(self.cfg, key, value, merge=False)
        return instantiate(self.cfg.credit)

    def __call__(self, trial: optuna.Trial) -> float:
        values = {p.name: p.suggest(trial) for p in self.spec.search_space}
        metrics = self.tuned.metrics(self.estimator(values))
        self.metrics[trial.number] = metrics
        trial.set_user_attr("metrics", metrics)
        if self.mlflow is not None:
            trial.set_user_attr("mlflow_run_id", self.mlflow.run_id)
        return metrics[self.spec.objective]

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.finished.append(trial)
        metrics = self.metrics.pop(trial.number, None)
        if self.mlflow is not None and metrics is not None:
            self.mlflow.trial(trial.number, metrics)

    def run(self) -> FidelitySweepResult:
        """The study (progress bar), then the judgement; files into ``<output_dir>/<study_name>/`` and MLflow."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(self.fidelity.torch_threads)
        self.mlflow = StudyRun.start(self.uri, self.spec, self.cfg, self.tuned, self.holdout) if self.uri else None
        status = "FAILED"
        try:
            started = time.perf_counter()
            sweep = run_sweep(self.spec, self, after_trial=self.after_trial, progress_bar=True)
            seconds = time.perf_counter() - started
            judgement = self.judge(sweep)
            timing = {"study_s": seconds, "trials_per_s": sweep.ran_here / seconds if seconds > 0 else 0.0}
            if self.mlflow is not None:
                self.mlflow.flush()
                timing["mlflow_ms_per_trial"] = 1e3 * self.mlflow.seconds / max(sweep.ran_here, 1)
            log.info("[%s] %d trials in %.1f s (%.1f trials/s)%s", self.spec.study_name, sweep.ran_here, seconds,
                     timing["trials_per_s"], f", MLflow {timing['mlflow_ms_per_trial']:.1f} ms a trial"
                     if "mlflow_ms_per_trial" in timing else "")
            files = self._write(sweep, judgement)
            if self.mlflow is not None:
                self.mlflow.finish(self.spec.objective, sweep, judgement, timing, files)
            status = "FINISHED"
            return FidelitySweepResult(sweep, judgement, self.mlflow.run_id if self.mlflow else None, timing)
        except (KeyboardInterrupt, SystemExit):
            status = "KILLED"
            raise
        finally:
            torch.set_num_threads(threads)
            if self.mlflow is not None:
                self.mlflow.end(status)

    def judge(self, sweep: SweepResult) -> Judgement | None:
        """The best trial's setting against the defaults, on the tuned and the holdout files (logged as a table)."""
        if sweep.best_trial is None:
            log.warning("[%s] no trial completed: nothing to judge", self.spec.study_name)
            return None
        settings = {"defaults": dict(self.defaults), "best": {**self.defaults, **sweep.best_params}}
        estimators = {name: self.estimator(values) for name, values in settings.items()}
        seed = int(self.spec.sampler.seed or 0)
        comparisons = [compare(files, estimators["defaults"], estimators["best"], self.fidelity.bootstrap, seed)
                       if files else None for files in (self.tuned, self.holdout)]
        judgement = Judgement(self.spec.objective, sweep.best_trial, settings, comparisons[0], comparisons[1])
        log.info("[%s] best trial %d against the defaults (mean over files; best - defaults with its 95%% paired "
                 "bootstrap interval over steps):\n%s", self.spec.study_name, sweep.best_trial,
                 "\n".join(table(judgement)))
        if judgement.holdout is None:
            log.warning("[%s] no fidelity.holdout files: the best setting is judged only on the files it was tuned "
                        "on, where its gain is biased upward", self.spec.study_name)
        return judgement

    def _write(self, sweep: SweepResult, judgement: Judgement | None) -> list[Path]:
        out = Path(self.spec.output_dir) / self.spec.study_name
        out.mkdir(parents=True, exist_ok=True)
        trials = optuna.load_study(study_name=self.spec.study_name, storage=self.spec.storage).get_trials(
            deepcopy=False) if self.spec.storage else self.finished  # every process's trials, where they are stored
        files = [write_trials(out / "trials.csv", trials)]
        if judgement is not None:
            (out / "judgement.md").write_text(
                f"# Fidelity sweep {self.spec.study_name}: best trial {judgement.best_trial} against the defaults\n\n"
                + "\n".join(table(judgement)) + "\n\n"
                + "\n".join(f"- {name}: {json.dumps(values)}" for name, values in judgement.settings.items()) + "\n")
            (out / "judgement.json").write_text(json.dumps(asdict(judgement), indent=2, default=str))
            files += [out / "judgement.md", out / "judgement.json"]
        return files


def write_trials(path: Path, trials: Sequence[optuna.trial.FrozenTrial]) -> Path:
    """One row per trial: number, state, value, params, metrics (the ``metrics`` user attr)."""
    params = sorted({k for t in trials for k in t.params})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trial", "state", "value", *params, *METRICS])
        for t in trials:
            metrics = t.user_attrs.get("metrics") or {}
            writer.writerow([t.number, t.state.name, t.value, *(t.params.get(k) for k in params),
                             *(metrics.get(m) for m in METRICS)])
    return path


def _cell(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:+.3f}"


def table(judgement: Judgement) -> list[str]:
    """Markdown: per metric (the objective starred) defaults, best and best - defaults [95%] on each file set."""
    parts = [(name, c) for name, c in (("tuned", judgement.tuned), ("holdout", judgement.holdout)) if c is not None]
    lines = ["; ".join(f"{name}: {len(c.files)} file(s), {c.steps} steps" for name, c in parts), "",
             "| metric | " + " | ".join(f"{name} {col}" for name, _ in parts
                                        for col in ("defaults", "best", "best - defaults [95%]")) + " |",
             "|---|" + "---|" * 3 * len(parts)]
    for m in METRICS:
        cells = []
        for _, c in parts:
            cells += [_cell(c.defaults[m]), _cell(c.best[m]),
                      "n/a" if not math.isfinite(c.difference[m].value) else str(c.difference[m])]
        lines.append(f"| {m}{' *' if m == judgement.objective else ''} | " + " | ".join(cells) + " |")
    return lines


class StudyRun:
    """The MLflow run of one invocation (see the module doc). Trial metrics are buffered and sent ``FLUSH_TRIALS``
    trials per call; tracking failures after the start only warn (they never stop the study)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.pending: list[Any] = []
        self.buffered = 0
        self.seconds = 0.0  # spent logging trials

    @classmethod
    def start(cls, uri: str, spec: SweepSpec, cfg: DictConfig, tuned: TruthFiles, holdout: TruthFiles | None
              ) -> StudyRun:
        from mlflow import MlflowClient

        from progpo.tracking import KIND_TAG, derive_tags, ensure_experiment, git_info
        from progpo.tracking.run_info import MAX_TAG_VALUE_LENGTH, clip

        client = MlflowClient(uri)
        experiment_id = ensure_experiment(client, spec.experiment_name, uri)
        tags = derive_tags(cfg, spec.experiment_name, spec.study_name)
        for key in ("env", "model"):  # the truth files' env and model, not the composed config's
            found = sorted({str(t.meta[key]) for t in tuned.truths if t.meta.get(key)})
            if found:
                tags[key] = ",".join(found)
        git = git_info()
        tags.update({KIND_TAG: KIND, "optuna.study_name": spec.study_name, "optuna.objective": spec.objective,
                     "git_commit": git.commit, "mlflow.source.git.commit": git.commit,
                     "fidelity.truth": clip(",".join(tuned.paths), MAX_TAG_VALUE_LENGTH),
                     "fidelity.holdout": clip(",".join(holdout.paths) if holdout else "", MAX_TAG_VALUE_LENGTH)})
        run = client.create_run(experiment_id, run_name=f"{spec.study_name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                tags=tags)
        log.info("MLflow run %s in experiment %r at %s", run.info.run_id, spec.experiment_name, uri)
        return cls(client, run.info.run_id)

    def trial(self, number: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(f"trial/{m}", float(v), now, number) for m, v in metrics.items() if math.isfinite(v)]
        self.buffered += 1
        if self.buffered >= FLUSH_TRIALS:
            self.flush()

    def flush(self) -> None:
        started = time.perf_counter()
        try:
            for first in range(0, len(self.pending), 1000):  # MLflow's limit per call
                self.client.log_batch(self.run_id, metrics=self.pending[first : first + 1000])
        except Exception as error:  # bookkeeping only
            log.warning("could not log trial metrics to MLflow run %s: %s", self.run_id, error)
        self.pending, self.buffered = [], 0
        self.seconds += time.perf_counter() - started

    def finish(self, objective: str, sweep: SweepResult, judgement: Judgement | None, timing: Mapping[str, float],
               files: Sequence[Path]) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        metrics = {f"perf/{k}": v for k, v in timing.items()}
        params: dict[str, Any] = {"best_trial": sweep.best_trial, "objective": objective}
        if judgement is not None:
            for name, values in judgement.settings.items():
                params.update({f"{name}/{k}": v for k, v in values.items()})
            for part, comparison in (("tuned", judgement.tuned), ("holdout", judgement.holdout)):
                if comparison is None:
                    continue
                for m in METRICS:
                    diff = comparison.difference[m]
                    metrics.update({f"{part}/defaults/{m}": comparison.defaults[m], f"{part}/best/{m}":
                                    comparison.best[m], f"{part}/best_minus_defaults/{m}": diff.value,
                                    f"{part}/best_minus_defaults/{m}_low": diff.low,
                                    f"{part}/best_minus_defaults/{m}_high": diff.high})
        if sweep.best_value is not None:
            metrics["best_value"] = sweep.best_value
        try:
            self.client.log_batch(
                self.run_id,
                metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(float(v))],
                params=[Param(k, str(v)) for k, v in params.items()],
            )
            for path in files:
                self.client.log_artifact(self.run_id, str(path), "fidelity_sweep")
        except Exception as error:  # bookkeeping only
            log.warning("could not log the judgement to MLflow run %s: %s", self.run_id, error)

    def end(self, status: str) -> None:
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as error:
            log.warning("could not end MLflow run %s: %s", self.run_id, error)

