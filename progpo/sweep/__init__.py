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

A sweep file with a ``fidelity:`` section (``sweeps/progpo_fidelity.yaml``) tunes credit fidelity on saved truth
files instead of training: thousands of millisecond trials, then the best setting judged against the paper's defaults
on holdout files (``progpo.sweep.fidelity``).

The package: ``spec`` (the sweep file), ``seeding`` (per-trial sampler seeds), ``study`` (storage, lock, stale
trials, study creation), ``runner`` (``run_sweep``), ``trial`` (trainer trials), ``fidelity`` (fidelity trials) and
``cli`` (``main``).
"""

from progpo.sweep.cli import main
from progpo.sweep.fidelity import Comparison, FidelityObjective, FidelitySweepResult, Judgement
from progpo.sweep.runner import FINISHED_STATES, SweepResult, run_sweep
from progpo.sweep.seeding import PerTrialSeedSampler, trial_seed
from progpo.sweep.spec import (
    PARAM_TYPES,
    FidelitySpec,
    ParamSpec,
    PrunerSpec,
    SamplerSpec,
    SweepSpec,
    SweepSpecError,
    load_spec,
    spec_from_mapping,
)
from progpo.sweep.study import KilledTrialCallback, create_study, make_storage, storage_lock, trials_toward_n
from progpo.sweep.trial import (
    OptunaTrialCallback,
    TrainerObjective,
    check_trainer_config,
    trial_config,
)

__all__ = [
    "FINISHED_STATES",
    "Comparison",
    "FidelityObjective",
    "FidelitySpec",
    "FidelitySweepResult",
    "Judgement",
    "PARAM_TYPES",
    "KilledTrialCallback",
    "OptunaTrialCallback",
    "ParamSpec",
    "PerTrialSeedSampler",
    "PrunerSpec",
    "SamplerSpec",
    "SweepResult",
    "SweepSpec",
    "SweepSpecError",
    "TrainerObjective",
    "check_trainer_config",
    "create_study",
    "load_spec",
    "main",
    "make_storage",
    "run_sweep",
    "spec_from_mapping",
    "storage_lock",
    "trial_config",
    "trial_seed",
    "trials_toward_n",
]
