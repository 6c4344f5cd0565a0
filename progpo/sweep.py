"""`python -m progpo.sweep SWEEP.yaml [key=value ...] [-- trainer overrides ...]`: Optuna sweeps of the trainer.

A sweep file (``sweeps/*.yaml``) names the study, its storage, the objective metric, sampler, pruner, search space
(dotted trainer config keys) and the Hydra overrides every trial starts from. Each trial composes the trainer config
with Hydra's compose API, applies the sampled values, runs ``progpo.train.train`` with a pruning callback, and
returns the objective. Trials are MLflow runs in the study's MLflow experiment (tags ``optuna.study_name``,
``optuna.trial_number``; trial user attr ``mlflow_run_id``).

``n_trials`` is the size the study should reach, counting started trials in every state: a new study gets
``n_trials`` trials, a second invocation with a larger ``n_trials`` continues it (``load_if_exists``), and several
processes on one storage stop together at exactly ``n_trials`` (the check "fewer than n trials? then ask for one"
runs under a lock on the storage). Failed and NaN trials are recorded as FAIL and count; the study goes on.
A trial whose worker died (no heartbeat for ``2 * heartbeat_s``) becomes FAIL at the start of the next invocation
or trial of any process and does not count: its point is queued again (``retry_killed`` times, see ``make_storage``).
With a sampler seed, trial n samples with a seed derived from (seed, n) (``PerTrialSeedSampler``), so workers and
continued studies never repeat each other's random start-up points.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import optuna
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

REPO_CONF = Path(__file__).resolve().parents[1] / "conf"
PARAM_TYPES = ("int", "float", "categorical")
FINISHED_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


class SweepSpecError(ValueError):
    """A sweep file or command-line setting is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class ParamSpec:
    """One dimension of the search space: a dotted trainer config key and its distribution."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def check(self) -> None:
        where = f"search_space.{self.name}"
        if self.type not in PARAM_TYPES:
            raise SweepSpecError(f"{where}.type must be one of {', '.join(PARAM_TYPES)}, got {self.type!r}")
        if self.type == "categorical":
            if not self.choices:
                raise SweepSpecError(f"{where}.choices must list at least one value for type categorical")
            return
        if self.low is None or self.high is None:
            raise SweepSpecError(f"{where} needs low and high for type {self.type}")
        if self.low > self.high:
            raise SweepSpecError(f"{where}: low={self.low} is above high={self.high}")
        if self.log and self.low <= 0:
            raise SweepSpecError(f"{where}: log scale needs low > 0, got {self.low}")
        if self.log and self.step is not None:
            raise SweepSpecError(f"{where}: step and log cannot be combined")

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        if self.type == "float":
            return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))


def trial_seed(seed: int, number: int) -> int:
    """The sampler seed of trial ``number`` in a study seeded with ``seed`` (numpy's ``SeedSequence`` of both)."""
    return int(np.random.SeedSequence([int(seed), int(number)]).generate_state(1)[0])


class PerTrialSeedSampler(optuna.samplers.BaseSampler):
    """A sampler built afresh for every trial with the seed ``trial_seed(seed, trial.number)``, to which it delegates.

    One seed per process would make workers that start together, or a study continued by a new process, draw the
    same random start-up points. Seeding by trial number keeps a seeded sweep reproducible whichever process runs a
    trial, and gives no two trials of a study the same seed.
    """

    def __init__(self, build: Callable[[int | None], optuna.samplers.BaseSampler], seed: int) -> None:
        self._build = build
        self._seed = seed
        self._sampler = build(seed)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._sampler = self._build(trial_seed(self._seed, trial.number))
        self._sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return self._sampler.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        return self._sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: optuna.trial.TrialState,
                    values: Sequence[float] | None) -> None:
        self._sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()


@dataclass(frozen=True)
class SamplerSpec:
    """``type``: tpe | random. ``seed``: trial n samples with ``trial_seed(seed, n)`` (reproducible, and distinct in
    every worker and continued study); null: OS entropy in every process."""

    type: str = "tpe"
    seed: int | None = 0
    n_startup_trials: int = 5
    multivariate: bool = False

    def build(self) -> optuna.samplers.BaseSampler:
        if self.seed is None:
            return self.build_seeded(None)
        return PerTrialSeedSampler(self.build_seeded, int(self.seed))

    def build_seeded(self, seed: int | None) -> optuna.samplers.BaseSampler:
        if self.type == "tpe":
            return optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=self.n_startup_trials, multivariate=self.multivariate
            )
        if self.type == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        raise SweepSpecError(f"sampler.type must be tpe or random, got {self.type!r}")


@dataclass(frozen=True)
class PrunerSpec:
    """``type``: median | none. Steps are RL iterations; the value is ``monitor`` (default: the objective)."""

    type: str = "median"
    n_startup_trials: int = 3
    n_warmup_steps: int = 1
    interval_steps: int = 1
    monitor: str | None = None

    def build(self) -> optuna.pruners.BasePruner:
        if self.type == "median":
            return optuna.pruners.MedianPruner(
                n_startup_trials=self.n_startup_trials,
                n_warmup_steps=self.n_warmup_steps,
                interval_steps=self.interval_steps,
            )
        if self.type == "none":
            return optuna.pruners.NopPruner()
        raise SweepSpecError(f"pruner.type must be median or none, got {self.type!r}")


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file (see ``sweeps/progpo_alfworld.yaml`` for the documented fields)."""

    study_name: str
    storage: str | None = "sqlite:///outputs/optuna.db"
    direction: str = "maximize"
    objective: str = "val/success"
    n_trials: int = 20
    timeout_s: float | None = None
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    search_space: tuple[ParamSpec, ...] = ()
    overrides: tuple[str, ...] = ()
    enqueue: tuple[dict[str, Any], ...] = ()
    mlflow_experiment: str | None = None
    output_dir: str = "outputs/sweeps"
    config_dir: str | None = None
    config_name: str = "config"
    heartbeat_s: int = 60
    retry_killed: int = 1

    @property
    def experiment_name(self) -> str:
        return self.mlflow_experiment or self.study_name

    @property
    def monitor(self) -> str:
        return self.pruner.monitor or self.objective

    def check(self) -> None:
        if not self.study_name:
            raise SweepSpecError("study_name must be a non-empty name, e.g. study_name=progpo_alfworld")
        if self.direction not in ("maximize", "minimize"):
            raise SweepSpecError(f"direction must be maximize or minimize, got {self.direction!r}")
        if self.n_trials < 1:
            raise SweepSpecError(f"n_trials must be >= 1, got {self.n_trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise SweepSpecError(f"timeout_s must be > 0 or null, got {self.timeout_s}")
        if self.heartbeat_s < 1:
            raise SweepSpecError(f"heartbeat_s must be >= 1, got {self.heartbeat_s}")
        if self.retry_killed < 0:
            raise SweepSpecError(f"retry_killed must be >= 0, got {self.retry_killed}")
        names = {p.name for p in self.search_space}
        for param in self.search_space:
            param.check()
        for i, point in enumerate(self.enqueue):
            unknown = sorted(set(point) - names)
            if unknown:
                raise SweepSpecError(f"enqueue[{i}] sets {unknown}, which are not in search_space ({sorted(names)})")
        self.sampler.build()
        self.pruner.build()


def _dataclass_from(cls: type, data: Mapping[str, Any], where: str) -> Any:
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise SweepSpecError(f"unknown key(s) {', '.join(f'{where}{k}' for k in unknown)}; known: {sorted(known)}")
    return cls(**data)


def spec_from_mapping(data: Mapping[str, Any]) -> SweepSpec:
    """Validate a plain mapping (a loaded sweep file) into a ``SweepSpec``."""
    data = dict(data)
    space = data.pop("search_space", None) or {}
    if not isinstance(space, Mapping):
        raise SweepSpecError("search_space must map dotted config keys to {type, low, high, ...}")
    params = []
    for name, node in space.items():
        if not isinstance(node, Mapping):
            raise SweepSpecError(f"search_space.{name} must be a mapping with a type, got {node!r}")
        node = dict(node)
        if "choices" in node:
            node["choices"] = tuple(node["choices"])
        params.append(_dataclass_from(ParamSpec, {"name": str(name), **node}, f"search_space.{name}."))
    sampler = _dataclass_from(SamplerSpec, dict(data.pop("sampler", None) or {}), "sampler.")
    pruner = _dataclass_from(PrunerSpec, dict(data.pop("pruner", None) or {}), "pruner.")
    overrides = data.pop("overrides", None) or []
    if isinstance(overrides, str) or not isinstance(overrides, Sequence):
        raise SweepSpecError("overrides must be a list of Hydra overrides, e.g. [credit=progpo, env=alfworld]")
    enqueue = tuple(dict(p) for p in (data.pop("enqueue", None) or []))
    spec = _dataclass_from(SweepSpec, data, "")
    spec = SweepSpec(**{**asdict(spec), "sampler": sampler, "pruner": pruner, "search_space": tuple(params),
                        "overrides": tuple(str(o) for o in overrides), "enqueue": enqueue})
    spec.check()
    return spec


def load_spec(path: str | Path, sets: Sequence[str] = ()) -> SweepSpec:
    """Read a sweep file and apply ``key=value`` settings (``n_trials=6``, ``sampler.seed=1``, ``storage=...``)."""
    path = Path(path)
    if not path.is_file():
        raise SweepSpecError(f"sweep file {path} does not exist; see sweeps/progpo_alfworld.yaml for an example")
    base = OmegaConf.load(path)
    bad = [s for s in sets if "=" not in s]
    if bad:
        raise SweepSpecError(f"settings must look like key=value, got {bad}")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(sets)))
    return spec_from_mapping(OmegaConf.to_container(merged, resolve=True))


# ----------------------------------------------------------------------------------------------- storage + lock


KilledTrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


def make_storage(spec: SweepSpec, on_killed: KilledTrialCallback | None = None) -> optuna.storages.BaseStorage | None:
    """RDB storage with heartbeats, or None (in memory).

    A trial sends a heartbeat every ``heartbeat_s`` while it runs; one without a heartbeat for ``2 * heartbeat_s``
    belongs to a dead worker (a live worker's trials keep beating, so several workers never fail each other's trials).
    Such a trial becomes FAIL the next time any process of the study looks (``optuna.storages.fail_stale_trials``,
    at the start of every invocation and of every trial) and Optuna's ``RetryHeartbeatStaleTrialCallback`` queues its
    point again, up to ``retry_killed`` times; then ``on_killed`` runs.
    """
    if spec.storage is None:
        return None
    url = spec.storage
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        path.parent.mkdir(parents=True, exist_ok=True)
    with _experimental():
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.retry_killed)

    def killed(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        log.warning("[%s] trial %d was RUNNING without a heartbeat for %ds (its worker died): marked FAIL%s",
                    spec.study_name, trial.number, 2 * spec.heartbeat_s,
                    "" if _retries(trial) >= spec.retry_killed else ", its point queued again")
        with _experimental():
            retry(study, trial)
        if on_killed is not None:
            on_killed(study, trial)

    try:
        with _experimental():
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=spec.heartbeat_s,
                grace_period=2 * spec.heartbeat_s,
                heartbeat_stale_trial_callback=killed,
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )
    except ModuleNotFoundError as error:
        raise SweepSpecError(
            f"storage={url!r} needs a database driver ({error.name}); for PostgreSQL: pip install -e '.[postgres]'"
        ) from error


@contextlib.contextmanager
def _experimental() -> Iterator[None]:
    """Heartbeats and their callbacks are "experimental" in Optuna, and exactly what we need: no warning for them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _retries(trial: optuna.trial.FrozenTrial) -> int:
    """How often the point of ``trial`` was queued again before it (0 for a first attempt)."""
    return len(trial.system_attrs.get("retry_history", []))


def trials_toward_n(trials: Sequence[optuna.trial.FrozenTrial]) -> int:
    """Trials that count toward ``n_trials``: started ones in any state, less killed ones that a retry replaces."""
    replaced = {t.system_attrs["retry_history"][-1] for t in trials if t.system_attrs.get("retry_history")}
    return sum(t.state != optuna.trial.TrialState.WAITING and t.number not in replaced for t in trials)


@contextlib.contextmanager
def storage_lock(storage: optuna.storages.BaseStorage | None, study_name: str) -> Iterator[None]:
    """A lock shared by every process of one study: a file lock for sqlite, an advisory lock for PostgreSQL.

    Other storages get an in-process lock only (processes may then overshoot ``n_trials`` by a few trials).
    """
    url = str(getattr(storage, "url", "") or "")
    if url.startswith("sqlite:///"):
        lock_path = Path(url[len("sqlite:///") :] + ".lock")
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if url.startswith("postgresql"):
        from sqlalchemy import text

        key = int.from_bytes(hashlib.blake2b(study_name.encode(), digest_size=8).digest(), "big", signed=True)
        with storage.engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        return
    with _LOCAL_LOCK:
        yield


_LOCAL_LOCK = threading.Lock()


# ----------------------------------------------------------------------------------------------- the study loop


@dataclass(frozen=True)
class SweepResult:
    """State of the study when this process stopped (``n_trials``: the trials that count, see ``trials_toward_n``)."""

    study_name: str
    n_trials: int
    complete: int
    pruned: int
    failed: int
    retried: int
    best_value: float | None
    best_params: dict[str, Any]
    best_trial: int | None
    ran_here: int


def _summary(study: optuna.Study, ran_here: int) -> SweepResult:
    trials = study.get_trials(deepcopy=False)
    by_state = {s: sum(t.state == s for t in trials) for s in FINISHED_STATES}
    best = None
    with contextlib.suppress(ValueError):
        best = study.best_trial
    return SweepResult(
        study_name=study.study_name,
        n_trials=trials_toward_n(trials),
        complete=by_state[optuna.trial.TrialState.COMPLETE],
        pruned=by_state[optuna.trial.TrialState.PRUNED],
        failed=by_state[optuna.trial.TrialState.FAIL],
        retried=sum(bool(t.system_attrs.get("retry_history")) for t in trials),
        best_value=best.value if best else None,
        best_params=dict(best.params) if best else {},
        best_trial=best.number if best else None,
        ran_here=ran_here,
    )


def create_study(spec: SweepSpec, storage: optuna.storages.BaseStorage | None = None) -> optuna.Study:
    study = optuna.create_study(
        study_name=spec.study_name,
        storage=storage,
        direction=spec.direction,
        sampler=spec.sampler.build(),
        pruner=spec.pruner.build(),
        load_if_exists=True,
    )
    if study.direction.name.lower() != spec.direction:
        raise SweepSpecError(
            f"study {spec.study_name!r} exists with direction {study.direction.name.lower()}; "
            f"use the same direction or another study_name"
        )
    return study


def run_sweep(
    spec: SweepSpec,
    objective: Callable[[optuna.Trial], float],
    after_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
    after_killed: KilledTrialCallback | None = None,
) -> SweepResult:
    """Run trials until ``spec.n_trials`` trials count (or ``timeout_s`` passes); see the module doc.

    ``after_trial`` runs after each trial of this process, ``after_killed`` for each trial of a dead worker that this
    process marks FAIL (see ``make_storage``).
    """
    storage = make_storage(spec, on_killed=after_killed)
    study = create_study(spec, storage)
    with storage_lock(storage, spec.study_name):
        for point in spec.enqueue:
            study.enqueue_trial(point, skip_if_exists=True)

    def progress(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if after_trial is not None:
            after_trial(study, trial)
        done = _summary(study, 0)
        value = f"{trial.value:.4g}" if trial.value is not None else "-"
        best = f"{done.best_value:.4g} (trial {done.best_trial})" if done.best_trial is not None else "-"
        log.info(
            "[%s] trial %d %s value=%s | %d/%d trials (complete %d, pruned %d, failed %d) | best %s",
            spec.study_name, trial.number, trial.state.name, value, done.n_trials, spec.n_trials,
            done.complete, done.pruned, done.failed, best,
        )

    started = time.monotonic()
    ran = 0
    while spec.timeout_s is None or time.monotonic() - started < spec.timeout_s:
        with contextlib.ExitStack() as held:
            held.enter_context(storage_lock(storage, spec.study_name))
            with _experimental():
                optuna.storages.fail_stale_trials(study)  # trials of dead workers: FAIL, their points queued again
            trials = study.get_trials(deepcopy=False)
            if trials_toward_n(trials) >= spec.n_trials:
                _log_running(spec, trials)
                break

            def locked_objective(trial: optuna.Trial, held: contextlib.ExitStack = held) -> float:
                held.close()  # the trial exists now (RUNNING) and counts for every other process
                return objective(trial)

            study.optimize(locked_objective, n_trials=1, catch=(Exception,), callbacks=[progress])
            ran += 1
    result = _summary(study, ran)
    log.info("[%s] stopped: %s", spec.study_name, result)
    return result


def _log_running(spec: SweepSpec, trials: Sequence[optuna.trial.FrozenTrial]) -> None:
    running = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    if running:
        log.info("[%s] trials %s are RUNNING in other workers; a trial whose worker died is marked FAIL (and its "
                 "point queued again) by the first invocation %ds after its last heartbeat",
                 spec.study_name, running, 2 * spec.heartbeat_s)


# ----------------------------------------------------------------------------------------------- trainer trials


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

    config_dir = str(Path(spec.config_dir).resolve() if spec.config_dir else REPO_CONF)
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
            cfg.logger.run_name = run_name
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


# ----------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    hydra_overrides: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, hydra_overrides = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m progpo.sweep",
        description="Optuna sweep of the progpo trainer. Trainer (Hydra) overrides go after `--`.",
    )
    parser.add_argument("sweep_file", help="sweep definition, e.g. sweeps/progpo_alfworld.yaml")
    parser.add_argument("settings", nargs="*", help="key=value settings of the sweep file, e.g. n_trials=20")
    parser.add_argument("--log-level", default="INFO")
    opts = parser.parse_args(args)
    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hydra.errors import HydraException

    try:
        spec = load_spec(opts.sweep_file, opts.settings)
        check_trainer_config(spec, hydra_overrides)
    except (ValueError, HydraException) as error:  # bad sweep file, bad override, invalid trainer config
        log.error("invalid sweep: %s", error)
        return 2
    objective = TrainerObjective(spec, hydra_overrides)
    result = run_sweep(spec, objective, after_trial=objective.after_trial, after_killed=objective.after_killed)
    print(json.dumps(asdict(result), indent=2, default=str))  # noqa: T201 - CLI output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
