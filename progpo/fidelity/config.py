"""``fidelity.*`` settings (``conf/fidelity.yaml``) and the named estimators they score, checked before anything
is built.

An estimator name is a credit config (``conf/credit/<name>.yaml``: grpo, gigpo, hgpo, progpo) or a credit config
and a Table 3 ablation joined by ``_`` (``progpo_plain`` = ``credit=progpo ablation=plain``), built exactly as
training builds it (``history`` follows ``rollout.history``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from progpo.config import CONF_DIR, ConfigError
from progpo.config.groups import require

TRUTH_ESTIMATORS = ("auto", "complement", "sampled")  # progpo.fidelity.truth explains them


@dataclass
class FidelityConfig:
    """What ``python -m progpo.fidelity`` measures; every field is documented in ``conf/fidelity.yaml``."""

    estimators: list[str]
    steps: int
    continuations: int
    truth_estimator: str
    gamma: float
    chunk: int
    bootstrap: int
    seed: int
    iteration: int | None
    save: str | None
    truth: str | None

    @classmethod
    def from_node(cls, node: DictConfig | dict[str, Any]) -> FidelityConfig:
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown key fidelity.{unknown[0]}; allowed keys: {', '.join(sorted(known))}")
        missing = sorted(known - set(values))
        if missing:
            raise ConfigError(f"fidelity.{missing[0]} is missing; conf/fidelity.yaml sets every key")
        config = cls(**values)
        config.estimators = list(config.estimators)
        config.check()
        return config

    def check(self) -> None:
        require(len(self.estimators) > 0, "fidelity.estimators", "a non-empty list of estimator names",
                self.estimators)
        require(isinstance(self.steps, int) and self.steps >= 3, "fidelity.steps", "an integer >= 3", self.steps)
        require(isinstance(self.continuations, int) and self.continuations >= 2, "fidelity.continuations",
                "an integer >= 2 (A_hat's standard error needs two returns of Q and of V)", self.continuations)
        require(self.truth_estimator in TRUTH_ESTIMATORS, "fidelity.truth_estimator",
                f"one of {', '.join(TRUTH_ESTIMATORS)}", self.truth_estimator)
        require(0 < self.gamma <= 1, "fidelity.gamma", "in (0, 1]", self.gamma)
        require(isinstance(self.chunk, int) and self.chunk >= 1, "fidelity.chunk", "an integer >= 1", self.chunk)
        require(isinstance(self.bootstrap, int) and self.bootstrap >= 100, "fidelity.bootstrap",
                "an integer >= 100", self.bootstrap)
        require(self.iteration is None or self.iteration >= 0, "fidelity.iteration", "null or >= 0",
                self.iteration)
        for name in self.estimators:
            estimator_node(name, OmegaConf.create({"rollout": {"history": 2}}))


def estimator_choices() -> tuple[list[str], list[str]]:
    """The credit configs and the ablations an estimator name can combine."""
    credits = sorted(p.stem for p in (CONF_DIR / "credit").glob("*.yaml"))
    ablations = sorted(p.stem for p in (CONF_DIR / "ablation").glob("*.yaml"))
    return credits, ablations


def estimator_node(name: str, cfg: DictConfig) -> DictConfig:
    """The resolved ``_target_`` node of estimator ``name`` (``rollout.history`` is read from ``cfg``)."""
    credits, ablations = estimator_choices()
    credit, _, ablation = name.partition("_")
    if credit not in credits or (ablation and ablation not in ablations):
        raise ConfigError(
            f"fidelity.estimators: unknown estimator {name!r}; use a credit config ({', '.join(credits)}) or "
            f"one joined to an ablation with _ (e.g. progpo_{ablations[0] if ablations else 'plain'}; "
            f"ablations: {', '.join(ablations)})"
        )
    node = OmegaConf.load(CONF_DIR / "credit" / f"{credit}.yaml")
    if ablation:
        node = OmegaConf.merge(node, OmegaConf.load(CONF_DIR / "ablation" / f"{ablation}.yaml").get("credit", {}))
    wrapper = OmegaConf.create({"rollout": OmegaConf.to_container(cfg.rollout, resolve=True), "credit": node})
    return OmegaConf.create(OmegaConf.to_container(wrapper.credit, resolve=True))


def build_estimators(names: list[str], cfg: DictConfig) -> dict[str, Any]:
    """Every named estimator, built (a bad parameter fails here, before the run is built)."""
    from hydra.utils import instantiate

    return {name: instantiate(estimator_node(name, cfg)) for name in names}
