"""Per-trial sampler seeds: ``trial_seed`` and ``PerTrialSeedSampler``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna


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
