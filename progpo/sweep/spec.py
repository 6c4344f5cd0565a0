"""The sweep file: its dataclasses (``SweepSpec`` and its parts), their parsing (``spec_from_mapping``,
``load_spec``) and checks (``SweepSpecError``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf

from progpo.sweep.seeding import PerTrialSeedSampler

PARAM_TYPES = ("int", "float", "categorical")


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


LOWER_IS_BETTER = ("wrong_sign",)  # fidelity metrics a study minimizes; every other one it maximizes


@dataclass(frozen=True)
class FidelitySpec:
    """The ``fidelity:`` section: its presence makes the sweep tune credit fidelity on saved truth files instead of
    training (``progpo.sweep.fidelity``).

    ``truth``: the files the objective is the mean over; ``holdout``: files judged on after the study only (the
    sampler never sees them); ``bootstrap``: resamples of the paired interval (best - defaults) of that judgement;
    ``torch_threads``: torch threads while estimators run (a call on a few thousand steps is too small to split:
    5 ms on one thread, 170 ms on two of a busy two-core machine). Paths are relative to the working directory."""

    truth: tuple[str, ...] = ()
    holdout: tuple[str, ...] = ()
    bootstrap: int = 1000
    torch_threads: int = 1

    def check(self, objective: str, direction: str) -> None:
        from progpo.fidelity.scoring import METRICS

        if not self.truth:
            raise SweepSpecError("fidelity.truth must list at least one truth file (python -m progpo.fidelity "
                                 "writes one: outputs/fidelity/<run>/truth.npz)")
        if objective not in METRICS:
            raise SweepSpecError(f"objective {objective!r} is not a fidelity metric; a sweep with a fidelity section "
                                 f"tunes one of {', '.join(METRICS)}")
        wanted = "minimize" if objective in LOWER_IS_BETTER else "maximize"
        if direction != wanted:
            raise SweepSpecError(f"direction {direction!r} with objective {objective}: a better {objective} is "
                                 f"{'lower' if wanted == 'minimize' else 'higher'}; set direction: {wanted}")
        tuned = {str(Path(p).resolve()) for p in self.truth}
        for i, path in enumerate(self.holdout):
            if str(Path(path).resolve()) in tuned:
                raise SweepSpecError(f"fidelity.holdout[{i}] {path} is also in fidelity.truth; a holdout file must "
                                     f"be one the study is not tuned on")
        if self.bootstrap < 100:
            raise SweepSpecError(f"fidelity.bootstrap must be >= 100, got {self.bootstrap}")
        if self.torch_threads < 1:
            raise SweepSpecError(f"fidelity.torch_threads must be >= 1, got {self.torch_threads}")


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
    fidelity: FidelitySpec | None = None  # set: the objective is credit fidelity on truth files, not training

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
        if self.fidelity is not None:
            self.fidelity.check(self.objective, self.direction)


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
    fidelity = _fidelity_from(data.pop("fidelity")) if "fidelity" in data else None
    spec = _dataclass_from(SweepSpec, data, "")
    spec = SweepSpec(**{**asdict(spec), "sampler": sampler, "pruner": pruner, "search_space": tuple(params),
                        "overrides": tuple(str(o) for o in overrides), "enqueue": enqueue, "fidelity": fidelity})
    spec.check()
    return spec


def _fidelity_from(node: Any) -> FidelitySpec:
    """The ``fidelity:`` section; a single path stands for a list of one (``fidelity.truth=PATH`` on the CLI)."""
    if not isinstance(node, Mapping):
        raise SweepSpecError("fidelity must be a mapping: {truth: [files], holdout: [files]}")
    node = dict(node)
    for key in ("truth", "holdout"):
        value = node.get(key) or ()
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
            raise SweepSpecError(f"fidelity.{key} must be a list of truth file paths, got {value!r}")
        node[key] = tuple(value)
    return _dataclass_from(FidelitySpec, node, "fidelity.")


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
