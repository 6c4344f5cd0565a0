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
