"""The study's storage (heartbeats, trials of dead workers), the lock shared by its processes, its creation."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import optuna

from progpo.sweep.spec import SweepSpec, SweepSpecError
from progpo.tracking.locks import file_lock

log = logging.getLogger(__package__)


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
            storage = optuna.storages.RDBStorage(
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
    if url.startswith("sqlite:///"):
        _write_ahead_log(storage, url[len("sqlite:///") :])
    return storage


def _write_ahead_log(storage: optuna.storages.RDBStorage, path: str) -> None:
    """sqlite in write-ahead-log mode, without an fsync per commit (``synchronous=NORMAL``).

    A trial commits about 20 times (trial, each parameter, heartbeat, value, state) and sqlite's default fsyncs every
    commit: on this project's busy two-core machine a trial of a trivial objective took 250-290 ms, 65-70 ms in WAL
    mode (100 trials), and the fidelity sweep (``progpo.sweep.fidelity``, millisecond trials) ran 3.4 trials/s, 13.9
    in WAL mode (200 trials): 2000 trials in 3 minutes instead of 10. Trainer trials (minutes) do not notice. The file
    stays consistent after a crash; a power loss may undo the last commits. WAL needs a local disk (not NFS), as
    several processes on one sqlite file already do.
    """
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened so far lack the pragma
    try:
        with file_lock(path + ".lock"), storage.engine.connect() as connection:  # the lock of ``storage_lock``
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")  # kept in the file: once per database
    except OperationalError as error:  # another process holds it: commits are slower, nothing else changes
        log.warning("sqlite storage %s stays in rollback-journal mode (%s)", path, error)


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
        with file_lock(url[len("sqlite:///") :] + ".lock"):
            yield
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
