"""``run_sweep``: the study loop of one process, and its ``SweepResult``."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from progpo.progress import progress_bar
from progpo.sweep.spec import SweepSpec
from progpo.sweep.study import (
    KilledTrialCallback,
    _experimental,
    create_study,
    make_storage,
    storage_lock,
    trials_toward_n,
)

log = logging.getLogger(__package__)

FINISHED_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


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


def run_sweep(
    spec: SweepSpec,
    objective: Callable[[optuna.Trial], float],
    after_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
    after_killed: KilledTrialCallback | None = None,
    progress_bar: bool = False,
) -> SweepResult:
    """Run trials until ``spec.n_trials`` trials count (or ``timeout_s`` passes); see the ``progpo.sweep`` doc.

    ``after_trial`` runs after each trial of this process, ``after_killed`` for each trial of a dead worker that this
    process marks FAIL (see ``make_storage``). ``progress_bar``: for thousands of short trials, a progress bar
    (refreshed every 5 s) replaces the log line per trial (Optuna's and ours) and the study summary behind it.
    """
    storage = make_storage(spec, on_killed=after_killed)
    study = create_study(spec, storage)
    with storage_lock(storage, spec.study_name):
        for point in spec.enqueue:
            study.enqueue_trial(point, skip_if_exists=True)

    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(_progress_bar(spec, study, after_trial)) if progress_bar else _progress(
            spec, after_trial)
        ran = _loop(spec, study, storage, objective, progress)
    result = _summary(study, ran)
    log.info("[%s] stopped: %s", spec.study_name, result)
    return result


def _loop(spec: SweepSpec, study: optuna.Study, storage: optuna.storages.BaseStorage | None,
          objective: Callable[[optuna.Trial], float],
          progress: Callable[[optuna.Study, optuna.trial.FrozenTrial], None]) -> int:
    """One trial at a time while the study has fewer than ``n_trials`` (under the storage lock); trials run here."""
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
    return ran


def _progress(
    spec: SweepSpec, after_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """The callback after each trial of this process: ``after_trial``, then one log line on the study's progress."""

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

    return progress


@contextlib.contextmanager
def _progress_bar(
    spec: SweepSpec, study: optuna.Study, after_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None
) -> Iterator[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]]:
    """The callback of ``progress_bar=True``: ``after_trial``, then the bar (the best value of this process's trials
    as postfix: the study's best would cost a database query per trial). Optuna's log line per trial is off."""
    sign = 1.0 if spec.direction == "maximize" else -1.0
    best: list[float] = []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bar = progress_bar(total=spec.n_trials, initial=min(trials_toward_n(study.get_trials(deepcopy=False)), spec.n_trials),
               desc=spec.study_name, unit="trial", mininterval=5)

    def progress(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if after_trial is not None:
            after_trial(study, trial)
        if trial.value is not None and math.isfinite(trial.value) and (not best or sign * trial.value > sign * best[0]):
            best[:] = [trial.value]
            bar.set_postfix(best=f"{trial.value:.4g} (trial {trial.number})", refresh=False)
        log.debug("[%s] trial %d %s value=%s", spec.study_name, trial.number, trial.state.name, trial.value)
        bar.update(1)

    try:
        yield progress
    finally:
        bar.close()
        optuna.logging.set_verbosity(verbosity)


def _log_running(spec: SweepSpec, trials: Sequence[optuna.trial.FrozenTrial]) -> None:
    running = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    if running:
        log.info("[%s] trials %s are RUNNING in other workers; a trial whose worker died is marked FAIL (and its "
                 "point queued again) by the first invocation %ds after its last heartbeat",
                 spec.study_name, running, 2 * spec.heartbeat_s)
