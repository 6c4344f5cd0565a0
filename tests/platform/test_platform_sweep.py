"""The sweep loop on real Optuna sqlite storage: spec checks, failures, resume, two processes, pruning."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlflow
import optuna
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from progpo.algo.iteration import EvalResult
from progpo.sweep import (
    OptunaTrialCallback,
    PrunerSpec,
    SamplerSpec,
    SweepSpecError,
    create_study,
    load_spec,
    run_sweep,
    spec_from_mapping,
)

REPO = Path(__file__).resolve().parents[2]
COMPLETE, PRUNED, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL


def _spec(tmp_path: Path, **extra):
    data = {
        "study_name": "unit",
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "n_trials": 4,
        "sampler": {"type": "tpe", "seed": 0, "n_startup_trials": 2},
        "pruner": {"type": "none"},
        "search_space": {
            "credit.lambda_tr": {"type": "float", "low": 0.0, "high": 1.0},
            "credit.history": {"type": "int", "low": 0, "high": 3},
        },
    }
    data.update(extra)
    return spec_from_mapping(data)


def quadratic(trial: optuna.Trial) -> float:
    lam = trial.suggest_float("credit.lambda_tr", 0.0, 1.0)
    history = trial.suggest_int("credit.history", 0, 3)
    if lam > 1.0:  # an enqueued out-of-range point: the trainer would reject it
        raise ValueError("lambda_tr must be <= 1")
    if history == 3 and lam == 0.0:
        return float("nan")
    return -((lam - 0.5) ** 2) - 0.1 * abs(history - 2)


def test_repo_sweep_file_parses_with_settings():
    spec = load_spec(REPO / "sweeps" / "progpo_alfworld.yaml", ["n_trials=6", "sampler.seed=3", "storage=null"])
    assert spec.n_trials == 6 and spec.sampler.seed == 3 and spec.storage is None
    names = [p.name for p in spec.search_space]
    assert names == ["rollout.history", "credit.min_value_group", "credit.k_sem", "credit.lambda_tr",
                     "credit.lambda_fb", "credit.var_floor"]
    var_floor = spec.search_space[-1]
    assert var_floor.log and var_floor.low == pytest.approx(1e-4)
    assert spec.enqueue[0]["credit.lambda_fb"] == pytest.approx(0.3)
    assert "credit=progpo" in spec.overrides


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_trials": 0}, "n_trials must be >= 1"),
        ({"direction": "up"}, "direction must be maximize or minimize"),
        ({"colour": "red"}, r"unknown key\(s\) colour"),
        ({"search_space": {"credit.k_sem": {"type": "int", "low": 5, "high": 1}}}, "low=5 is above high=1"),
        ({"search_space": {"credit.var_floor": {"type": "float", "low": 0, "high": 1, "log": True}}}, "log scale"),
        ({"search_space": {"credit.fusion": {"type": "choice"}}}, "type must be one of"),
        ({"sampler": {"type": "grid"}}, "sampler.type must be tpe or random"),
        ({"pruner": {"patience": 3}}, r"unknown key\(s\) pruner.patience"),
        ({"enqueue": [{"credit.k_sem": 3}]}, "not in search_space"),
    ],
)
def test_invalid_spec_names_the_field(tmp_path, change, message):
    with pytest.raises(SweepSpecError, match=message):
        _spec(tmp_path, **change)


def test_missing_sweep_file(tmp_path):
    with pytest.raises(SweepSpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_failures_are_recorded_and_the_study_resumes(tmp_path):
    bad = {"credit.lambda_tr": 1.5, "credit.history": 1}  # raises in the objective
    nan = {"credit.lambda_tr": 0.0, "credit.history": 3}  # returns NaN
    spec = _spec(tmp_path, enqueue=[bad, nan])
    first = run_sweep(spec, quadratic)
    assert (first.n_trials, first.ran_here, first.failed, first.complete) == (4, 4, 2, 2)
    study = optuna.load_study(study_name="unit", storage=spec.storage)
    states = [t.state for t in study.trials]
    assert states[:2] == [FAIL, FAIL] and states[2:] == [COMPLETE, COMPLETE]
    assert study.trials[0].params == bad

    again = run_sweep(_spec(tmp_path, enqueue=[bad, nan]), quadratic)  # same n_trials: nothing to do
    assert again.ran_here == 0 and again.n_trials == 4
    resumed = run_sweep(_spec(tmp_path, n_trials=6, enqueue=[bad, nan]), quadratic)
    assert (resumed.n_trials, resumed.ran_here) == (6, 2)
    study = optuna.load_study(study_name="unit", storage=spec.storage)
    assert [t.number for t in study.trials] == list(range(6))
    assert sum(t.state == FAIL for t in study.trials) == 2  # the enqueued points were not re-run
    assert resumed.best_value == max(t.value for t in study.trials if t.state == COMPLETE)


def test_direction_mismatch_with_an_existing_study(tmp_path):
    create_study(_spec(tmp_path), optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}"))
    with pytest.raises(SweepSpecError, match="exists with direction maximize"):
        run_sweep(_spec(tmp_path, direction="minimize"), quadratic)


WORKER = textwrap.dedent(
    """
    import sys, time, optuna
    from progpo.sweep import run_sweep, spec_from_mapping

    def slow(trial):
        x = trial.suggest_float("credit.lambda_tr", 0.0, 1.0)
        time.sleep(0.2)
        return x

    spec = spec_from_mapping({"study_name": "shared", "storage": sys.argv[1], "n_trials": int(sys.argv[2]),
                              "sampler": {"type": "random", "seed": None}, "pruner": {"type": "none"},
                              "search_space": {"credit.lambda_tr": {"type": "float", "low": 0.0, "high": 1.0}}})
    print("RAN", run_sweep(spec, slow).ran_here)
    """
)


@pytest.mark.slow
def test_two_processes_share_one_study_and_stop_at_n(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name="shared", storage=storage, direction="maximize")  # no table-creation race
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, storage, "10"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    ran = [int(out.split("RAN")[-1]) for out, _ in outputs]
    study = optuna.load_study(study_name="shared", storage=storage)
    assert [t.number for t in study.trials] == list(range(10))
    assert all(t.state == COMPLETE for t in study.trials)
    assert sum(ran) == 10 and min(ran) >= 1  # both worked, and no trial ran twice


class ValSuccessModel(BoringModel):
    """BoringModel whose validation returns a fixed held-out success per iteration, as ProGPOModule does:
    ``{"result": EvalResult}`` with the number of iterations done."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = values

    def validation_step(self, batch, batch_idx):
        done = self.current_epoch + 1  # validation runs at the end of the epoch, after its iteration
        return {"result": EvalResult(iteration=done, metrics={"val/success": self.values[done - 1]}, batch=None)}


def _fit(trial: optuna.Trial, values: list[float], logger=False) -> OptunaTrialCallback:
    import lightning as L

    callback = OptunaTrialCallback(trial, monitor="val/success")
    trainer = L.Trainer(max_epochs=len(values), limit_train_batches=2, limit_val_batches=1, logger=logger,
                        callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(ValSuccessModel(values))
    return callback


def test_pruning_callback_links_run_and_prunes(tmp_path):
    from progpo.tracking import make_logger

    pruner = PrunerSpec(type="median", n_startup_trials=1, n_warmup_steps=0).build()
    study = optuna.create_study(direction="maximize", pruner=pruner)
    good = study.ask()
    logger = make_logger({"seed": 0}, tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment_name="p",
                         retries=0)
    callback = _fit(good, [0.8, 0.9, 0.9], logger=logger)
    assert good.user_attrs["mlflow_run_id"] == logger.run_id == callback.run_id
    study.tell(good, 0.9)
    assert study.trials[0].intermediate_values == pytest.approx({1: 0.8, 2: 0.9, 3: 0.9})  # step = RL iteration

    bad = study.ask()
    with pytest.raises(optuna.TrialPruned, match=r"pruned at iteration 1: val/success=0\.1000"):
        _fit(bad, [0.1, 0.1, 0.1])
    study.tell(bad, state=PRUNED)
    assert study.trials[1].intermediate_values == pytest.approx({1: 0.1})
    assert not math.isnan(study.best_value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["n_trials=0"], "n_trials must be >= 1"),
        (["--", "credit=nonexistent"], "nonexistent"),
        (["--", "optim.lr=-1"], "optim.lr must be > 0"),
    ],
)
def test_cli_rejects_bad_input_before_any_trial(tmp_path, caplog, args, message):
    from progpo.sweep import main

    spec = REPO / "sweeps" / "progpo_alfworld.yaml"
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    assert main([str(spec), f"storage={storage}", *args]) == 2
    assert message in caplog.text
    assert not (tmp_path / "o.db").exists()  # no study was created


@pytest.mark.slow
def test_two_processes_on_postgresql_stop_at_n(postgres_url):
    """The distributed set-up of docker compose: the advisory lock keeps two workers at exactly n trials."""
    storage = f"{postgres_url}/optuna"
    optuna.create_study(study_name="shared", storage=storage, direction="maximize")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, storage, "8"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    study = optuna.load_study(study_name="shared", storage=storage)
    assert [t.number for t in study.trials] == list(range(8))
    assert all(t.state == COMPLETE for t in study.trials)
    assert sorted(int(out.split("RAN")[-1]) for out, _ in outputs)[0] >= 1


# A worker process: `python -c SEEDED_WORKER STORAGE N_TRIALS [HANG_AT]`. TPE seeded 0 (the sweep files' default) in
# its random start-up; trial HANG_AT first links a real MLflow run (like a trainer trial), writes `hanging-<n>` and
# hangs until killed.
SEEDED_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from dataclasses import asdict
    from pathlib import Path
    import mlflow
    from progpo.sweep import TrainerObjective, run_sweep, spec_from_mapping

    storage, n_trials = sys.argv[1], int(sys.argv[2])
    hang_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    together = int(sys.argv[4]) if len(sys.argv) > 4 else 1  # workers that must have started before any trial
    Path(f"started-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(Path().glob("started-*"))) < together and time.monotonic() < deadline:
        time.sleep(0.1)
    spec = spec_from_mapping({"study_name": "seeded", "storage": storage, "n_trials": n_trials, "heartbeat_s": 2,
                              "sampler": {"type": "tpe", "seed": 0, "n_startup_trials": 50},
                              "pruner": {"type": "none"},
                              "search_space": {"credit.lambda_tr": {"type": "float", "low": 0.0, "high": 1.0},
                                               "credit.history": {"type": "int", "low": 0, "high": 1000}}})

    def objective(trial):
        x = trial.suggest_float("credit.lambda_tr", 0.0, 1.0)
        trial.suggest_int("credit.history", 0, 1000)
        if trial.number == hang_at:
            uri = "sqlite:///" + str(Path("mlflow.db").resolve())
            client = mlflow.MlflowClient(uri)
            run = client.create_run(client.create_experiment("seeded"), run_name=f"trial{trial.number}")
            trial.set_user_attr("mlflow_tracking_uri", uri)
            trial.set_user_attr("mlflow_run_id", run.info.run_id)
            Path(f"hanging-{trial.number}").write_text(run.info.run_id)
            time.sleep(3600)
        time.sleep(0.3)
        return x

    result = run_sweep(spec, objective, after_killed=TrainerObjective(spec).after_killed)
    print("RESULT" + json.dumps(asdict(result)))
    """
)


def _worker(tmp_path: Path, storage: str, n_trials: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SEEDED_WORKER, storage, str(n_trials), *extra], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _result(proc: subprocess.Popen, timeout: float = 240) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.split("RESULT", 1)[1])


def _points(storage: str) -> list[tuple[float, int]]:
    study = optuna.load_study(study_name="seeded", storage=storage)
    return [(t.params["credit.lambda_tr"], t.params["credit.history"]) for t in study.trials]


@pytest.mark.slow
def test_seeded_workers_and_a_continued_study_never_repeat_a_point(tmp_path):
    """Two workers started together, then a third process continuing the study: all in TPE's random start-up."""
    storage = f"sqlite:///{tmp_path / 'seeded.db'}"
    optuna.create_study(study_name="seeded", storage=storage, direction="maximize")  # no table-creation race
    pair = [_worker(tmp_path, storage, 6, "-1", "2"), _worker(tmp_path, storage, 6, "-1", "2")]  # start together
    ran = [_result(p)["ran_here"] for p in pair]
    assert sum(ran) == 6 and min(ran) >= 1  # both workers ran trials
    assert _result(_worker(tmp_path, storage, 9))["ran_here"] == 3  # continued by a new process
    points = _points(storage)
    assert len(points) == 9 and len(set(points)) == 9, points

    # Seeds follow trial numbers, not processes: one process on a fresh storage draws the same nine points.
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _result(_worker(tmp_path, fresh, 9))["ran_here"] == 9
    assert _points(fresh) == points


def test_per_trial_seeds_differ_and_do_not_depend_on_the_process():
    from progpo.sweep import PerTrialSeedSampler, trial_seed

    assert len({trial_seed(0, n) for n in range(1000)} | {trial_seed(1, n) for n in range(1000)}) == 2000
    sampler = SamplerSpec(type="random", seed=7).build()
    assert isinstance(sampler, PerTrialSeedSampler)
    assert not isinstance(SamplerSpec(type="random", seed=None).build(), PerTrialSeedSampler)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_trial_is_failed_retried_and_does_not_count(tmp_path):
    storage = f"sqlite:///{tmp_path / 'seeded.db'}"
    optuna.create_study(study_name="seeded", storage=storage, direction="maximize")
    worker = _worker(tmp_path, storage, 2, "1")  # trial 0 completes, trial 1 hangs
    try:
        _wait_for(tmp_path / "hanging-1", worker)
        time.sleep(2.5)  # at least one heartbeat recorded
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    run_id = (tmp_path / "hanging-1").read_text()
    time.sleep(5.5)  # past the grace period (2 x heartbeat_s = 4 s; sqlite's clock has whole seconds)

    result = _result(_worker(tmp_path, storage, 2))  # the same n_trials: the killed trial must not count
    study = optuna.load_study(study_name="seeded", storage=storage)
    states = [t.state for t in study.trials]
    assert states == [COMPLETE, FAIL, COMPLETE], states
    assert study.trials[2].params == study.trials[1].params  # the killed point was run again
    assert study.trials[2].system_attrs["failed_trial"] == 1
    assert (result["n_trials"], result["ran_here"], result["retried"]) == (2, 1, 1)
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["optuna.state"] == "FAIL"


@pytest.mark.slow
def test_a_live_workers_running_trial_is_not_failed(tmp_path):
    """Heartbeats tell a live worker from a dead one: a second invocation leaves a long trial of a live one alone."""
    storage = f"sqlite:///{tmp_path / 'seeded.db'}"
    optuna.create_study(study_name="seeded", storage=storage, direction="maximize")
    slow = _worker(tmp_path, storage, 1, "0")  # trial 0 hangs (a long trial) while its worker lives
    try:
        _wait_for(tmp_path / "hanging-0", slow)
        time.sleep(5.0)  # longer than the grace period (4 s): only the heartbeats keep it alive
        result = _result(_worker(tmp_path, storage, 2))
        assert slow.poll() is None
        study = optuna.load_study(study_name="seeded", storage=storage)
        assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING, COMPLETE]
        assert (result["ran_here"], result["retried"]) == (1, 0)
    finally:
        os.killpg(slow.pid, signal.SIGKILL)
        slow.wait(timeout=30)
