"""End to end on the real trainer with the tiny settings (`experiment=fast_dev`): a Hydra multirun, an Optuna
sweep (failure, resume, two processes) and the report over the multirun's MLflow runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml
from processes import kill_when

from progpo.report import make_report

REPO = Path(__file__).resolve().parents[2]
# fast_dev shrunk further: the offline shop, 2 held-out goals, 3-step episodes, one task x 2 rollouts, one torch
# thread (several threads on a busy 2-core machine make a run 5x slower, not faster).
SMALL = ["env=webshop", "env.n_eval=2", "env.max_steps=3", "rollout.tasks_per_batch=1", "rollout.group_size=2",
         "torch_threads=1"]
COMPLETE, PRUNED, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                           optuna.trial.TrialState.FAIL)


def _run(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="1")
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.mark.slow
def test_multirun_2x2_then_report(tmp_path):
    """Through the joblib launcher (2 jobs at a time, as the laptop benchmark runs): four processes sharing one
    MLflow sqlite store, each run complete and distinct."""
    sweep_dir = tmp_path / "multirun"
    _run(["-m", "progpo.train", "-m", "experiment=[compare_methods,fast_dev]", "credit=grpo,progpo", "seed=0,1",
          *SMALL, f"hydra.sweep.dir={sweep_dir}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], cwd=tmp_path)
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("compare_methods")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 4
    assert sorted((r.data.tags["method"], r.data.tags["seed"]) for r in runs) == [
        ("grpo", "0"), ("grpo", "1"), ("progpo", "0"), ("progpo", "1")]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        assert run.info.status == "FINISHED"
        assert run.info.run_name == f"{tags['method']}-webshop-tiny-seed{tags['seed']}"  # readable and distinct
        assert tags["group"] == str(sweep_dir) and tags["env"] == "webshop" and tags["model"] == "tiny"
        assert tags["git_commit"] == head
        assert run.data.params["schedule.max_iterations"] == "1"
        assert 0.0 <= metrics["val/success"] <= 1.0 and "train/success" in metrics and "loss/policy" in metrics
        if tags["method"] == "progpo":
            assert {f"credit/{k}" for k in ("peer_zero", "transition_active", "still_zero")} <= set(metrics)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/success")]
        assert steps == [0, 1]  # the warm start, then after the one iteration

    files = make_report("compare_methods", tmp_path / "report")
    assert files.n_runs == 4
    table = (tmp_path / "report" / "table1_success.md").read_text()
    assert "| webshop | grpo | 2 |" in table and "| webshop | progpo | 2 |" in table
    assert {p.name for p in files.figures} == {"fig4_success_webshop.png", "fig5_credit_webshop.png"}


SWEEP = {
    "study_name": "e2e",
    "direction": "maximize",
    "objective": "val/success",
    "sampler": {"type": "tpe", "seed": 0, "n_startup_trials": 2},
    "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 0},
    "search_space": {
        "credit.lambda_tr": {"type": "float", "low": 0.0, "high": 1.0},
        "credit.lambda_fb": {"type": "float", "low": 0.0, "high": 1.0},
    },
    # trial 0: lambda_fb outside [0, 1] -> the trainer's config check raises -> a FAIL the study survives
    "enqueue": [{"credit.lambda_tr": 0.5, "credit.lambda_fb": 2.0}],
    "overrides": ["experiment=fast_dev", "credit=progpo", *SMALL],
}


@pytest.mark.slow
def test_sweep_failure_resume_and_two_processes(tmp_path):
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(SWEEP))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    settings = [f"storage={storage}", f"output_dir={tmp_path / 'sweeps'}"]
    _run(["-m", "progpo.sweep", str(spec_file), "n_trials=4", *settings], cwd=tmp_path)
    study = optuna.load_study(study_name="e2e", storage=storage)
    states = [t.state for t in study.trials]
    assert len(states) == 4 and states[0] == FAIL and set(states[1:]) <= {COMPLETE, PRUNED}
    assert states[1] == COMPLETE and states[2] == COMPLETE  # the pruner's two start-up trials are never pruned

    # Resume to 6 with two processes on the same storage: exactly two more trials, no number twice.
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-m", "progpo.sweep", str(spec_file), "n_trials=6", *settings],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-4000:] for _, err in outputs]
    study = optuna.load_study(study_name="e2e", storage=storage)
    assert [t.number for t in study.trials] == list(range(6))
    assert study.trials[0].state == FAIL and {t.state for t in study.trials[1:]} <= {COMPLETE, PRUNED}
    ran = sorted(json.loads(out[out.rindex('{\n  "study_name"') :])["ran_here"] for out, _ in outputs)
    assert ran == [1, 1]

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("e2e")
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert len(runs) == 6  # every trial is a run, the failed one included
    for trial in study.trials:
        run = runs[trial.user_attrs["mlflow_run_id"]]
        assert run.data.tags["optuna.study_name"] == "e2e"
        assert run.data.tags["optuna.trial_number"] == str(trial.number)
        assert run.info.run_name == f"progpo-webshop-tiny-seed0-trial{trial.number}"
        assert run.data.tags["optuna.state"] == trial.state.name
        assert run.info.status == {COMPLETE: "FINISHED", PRUNED: "KILLED", FAIL: "FAILED"}[trial.state]
        if trial.state == COMPLETE:
            assert float(run.data.params["credit.lambda_tr"]) == pytest.approx(trial.params["credit.lambda_tr"])
            assert run.data.metrics["val/success"] == pytest.approx(trial.value)
    assert "lambda_fb" in runs[study.trials[0].user_attrs["mlflow_run_id"]].data.tags["error"]


@pytest.mark.slow
def test_sigkilled_run_is_not_finished_and_the_report_leaves_it_out(tmp_path):
    """kill -9 after iteration 1's checkpoint: the MLflow run is RUNNING (not FINISHED), the report marks it KILLED
    and leaves it out; `resume=true` continues the same run, which ends FINISHED."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "progpo.train", "experiment=fast_dev", *SMALL, "logger=mlflow",
            f"logger.tracking_uri={uri}", "logger.experiment_name=killed", f"run_dir={run_dir}",
            "schedule.max_iterations=3", "eval.every=10", f"hydra.run.dir={tmp_path / 'hydra'}"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = run_dir / "checkpoints" / "iter-0001.ckpt"
    kill_when(args, tmp_path, env, first.exists)
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "RUNNING"  # the start-of-run validate's teardown did not finish it
    assert run.info.run_name == "progpo-webshop-tiny-seed0"
    assert 0 in [m.step for m in client.get_metric_history(run.info.run_id, "val/success")]  # the start value

    with pytest.raises(ValueError, match=r"no FINISHED training runs nor fidelity runs \(left out 1 run\(s\).*1 KILLED"):
        make_report("killed", tmp_path / "report", tracking_uri=uri, upload=False)
    assert client.get_run(run.info.run_id).info.status == "KILLED"  # its process is gone

    _run(["-m", "progpo.train", *args[3:], "resume=true"], cwd=tmp_path)
    (resumed,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert make_report("killed", tmp_path / "report", tracking_uri=uri, upload=False).n_runs == 1
