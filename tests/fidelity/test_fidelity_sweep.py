"""The fidelity sweep (``python -m progpo.sweep sweeps/progpo_fidelity.yaml``) on real truth files of the chain env,
real Optuna sqlite storage and a real sqlite MLflow store (``tests/conftest.py``): no model anywhere."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import mlflow
import numpy as np
import optuna
import pytest
import torch
import yaml
from chain import chain_collector

from progpo.algo.iteration import step_batch
from progpo.fidelity import FidelityTruth
from progpo.fidelity.selection import step_features, stratified_sample
from progpo.fidelity.truth import measure_truth
from progpo.sweep import FidelityObjective, SweepSpecError, load_spec, main, trial_config

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "sweeps" / "progpo_fidelity.yaml"
GAMMA = 0.95


def _measure(seed: int, path: Path) -> Path:
    """One chain batch (4 tasks x 6), 30 stratified steps with 16 + 16 continuations each, random embeddings."""
    torch.manual_seed(seed)
    collector = chain_collector()
    try:
        batch = collector.collect(collector.suite.train_tasks, group_size=6)
        steps = step_batch(batch.turns, None)
        won = {e.traj: e.won for e in batch.episodes}
        chosen = stratified_sample(step_features(steps, won), 30, seed=seed)
        played = measure_truth(collector, batch.turns, batch.episodes, chosen, 16, GAMMA, chunk=1000)
    finally:
        collector.close()
    embedding = torch.from_numpy(np.random.default_rng(seed).standard_normal((steps.n, 8)).astype(np.float32))
    steps = step_batch(batch.turns, embedding)  # random state embeddings: semantic expansion has input
    return FidelityTruth.measured(steps, won, chosen, played, {"gamma": GAMMA, "env": "chain"}).save(path)


@pytest.fixture(scope="module")
def truth_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("truth")
    return {"tune": _measure(0, root / "tune" / "truth.npz"), "holdout": _measure(1, root / "holdout" / "truth.npz")}


def _settings(tmp_path: Path, truth: list[Path], holdout: list[Path], n_trials: int = 30) -> list[str]:
    def paths(files: list[Path]) -> str:
        return "[" + ",".join(str(p) for p in files) + "]"

    return [f"storage=sqlite:///{tmp_path / 'optuna.db'}", f"n_trials={n_trials}", f"output_dir={tmp_path / 'out'}",
            "sampler.n_startup_trials=10", f"fidelity.truth={paths(truth)}", f"fidelity.holdout={paths(holdout)}",
            "fidelity.bootstrap=200"]


def test_repo_sweep_file_has_the_training_sweeps_search_space_and_defaults():
    fidelity = load_spec(SWEEP, ["storage=null"])
    training = load_spec(REPO / "sweeps" / "progpo_alfworld.yaml", ["storage=null"])
    assert fidelity.search_space == training.search_space and fidelity.enqueue == training.enqueue
    assert fidelity.fidelity is not None and fidelity.fidelity.truth and fidelity.fidelity.holdout
    assert fidelity.objective == "spearman" and fidelity.n_trials >= 1000
    assert "credit=progpo" in fidelity.overrides and training.fidelity is None


def test_sweep_tunes_on_truth_files_and_judges_on_holdout(tmp_path, truth_files, capsys):
    settings = _settings(tmp_path, [truth_files["tune"]], [truth_files["holdout"]])
    assert main([str(SWEEP), *settings, "study_name=fid"]) == 0
    result = json.loads(capsys.readouterr().out)

    study = optuna.load_study(study_name="fid", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    trials = study.trials
    assert len(trials) == 30 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    defaults = load_spec(SWEEP, ["storage=null"]).enqueue[0]
    assert trials[0].params == pytest.approx(defaults)  # the paper's values first
    assert study.best_value >= trials[0].value
    assert result["sweep"]["best_value"] == pytest.approx(study.best_value)

    judgement = result["judgement"]
    assert judgement["best_trial"] == study.best_trial.number
    assert judgement["settings"]["defaults"] == pytest.approx(defaults)
    tuned, holdout = judgement["tuned"], judgement["holdout"]
    # Re-scored after the study, the tuned numbers are the trials' own.
    assert tuned["defaults"]["spearman"] == pytest.approx(trials[0].value)
    assert tuned["best"]["spearman"] == pytest.approx(study.best_value)
    assert tuned["best"]["spearman"] >= tuned["defaults"]["spearman"]
    assert holdout["files"] == [str(truth_files["holdout"])]
    for name in ("defaults", "best"):
        assert np.isfinite(holdout[name]["spearman"]) and -1 <= holdout[name]["spearman"] <= 1
    diff = holdout["difference"]["spearman"]
    assert diff["value"] == pytest.approx(holdout["best"]["spearman"] - holdout["defaults"]["spearman"])
    assert diff["low"] <= diff["value"] <= diff["high"]
    assert result["timing"]["trials_per_s"] > 0

    # MLflow: one run for the study, every trial at step = its number, the best params, the judgement, the table.
    run_id = result["mlflow_run_id"]
    assert all(t.user_attrs["mlflow_run_id"] == run_id for t in trials)
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["progpo.kind"] == "fidelity_sweep" and run.data.tags["optuna.study_name"] == "fid"
    history = client.get_metric_history(run_id, "trial/spearman")
    assert sorted(m.step for m in history) == list(range(30))
    assert {m.step: m.value for m in history} == pytest.approx({t.number: t.value for t in trials})
    best = study.best_trial.params
    assert {k: float(run.data.params[f"best/{k}"]) for k in best} == pytest.approx(best)
    assert run.data.params["best_trial"] == str(study.best_trial.number)
    assert run.data.metrics["holdout/best/spearman"] == pytest.approx(holdout["best"]["spearman"])
    assert run.data.metrics["holdout/defaults/spearman"] == pytest.approx(holdout["defaults"]["spearman"])
    assert "holdout/best_minus_defaults/spearman_low" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run_id, "fidelity_sweep")}
    assert {"fidelity_sweep/trials.csv", "fidelity_sweep/judgement.md"} <= artifacts
    with open(tmp_path / "out" / "fid" / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["trial"]) for r in rows] == list(range(30))
    assert float(rows[0]["spearman"]) == pytest.approx(trials[0].value)

    # A second invocation with a larger n_trials continues the study (its own MLflow run).
    assert main([str(SWEEP), *_settings(tmp_path, [truth_files["tune"]], [truth_files["holdout"]], 33),
                 "study_name=fid"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["sweep"]["ran_here"] == 3 and again["mlflow_run_id"] != run_id
    assert len(optuna.load_study(study_name="fid", storage=f"sqlite:///{tmp_path / 'optuna.db'}").trials) == 33


def test_a_trial_builds_the_estimator_a_trainer_trial_builds(tmp_path, truth_files):
    """Composed once, values set per trial == ``trial_config`` composed per trial; history follows rollout.history."""
    from hydra.utils import instantiate

    spec = load_spec(SWEEP, _settings(tmp_path, [truth_files["tune"]], []))
    objective = FidelityObjective(spec, ["logger=none"])  # no MLflow store to create: composing is what is tested
    assert objective.uri is None
    rng = np.random.default_rng(0)
    for number in range(3):
        values = {"rollout.history": int(rng.integers(0, 4)), "credit.min_value_group": int(rng.integers(0, 7)),
                  "credit.k_sem": int(rng.integers(1, 11)), "credit.lambda_tr": float(rng.random()),
                  "credit.lambda_fb": float(rng.random()), "credit.var_floor": float(10 ** rng.uniform(-4, -1))}
        fast = objective.estimator(values)
        composed = instantiate(trial_config(spec, values, number, ["logger=none"]).credit)
        assert type(fast) is type(composed) and vars(fast) == vars(composed)
        assert fast.history == values["rollout.history"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"truth": "missing"}, r"fidelity.truth\[1\]: no truth file at .*python -m progpo.fidelity"),
        ({"holdout": "missing"}, r"fidelity.holdout\[0\]: no truth file at"),
        ({"truth": "none"}, "fidelity.truth must list at least one truth file"),
        ({"set": "objective=success"}, "objective 'success' is not a fidelity metric"),
        ({"set": "objective=wrong_sign"}, "set direction: minimize"),
        ({"holdout": "tuned"}, r"fidelity.holdout\[0\] .* is also in fidelity.truth"),
        ({"space": "optim.lr"}, "search_space.optim.lr does not change the credit estimator"),
    ],
)
def test_bad_input_fails_before_any_trial_naming_the_key(tmp_path, truth_files, caplog, change, message):
    tune, holdout = [truth_files["tune"]], [truth_files["holdout"]]
    if change.get("truth") == "missing":
        tune.append(tmp_path / "nope" / "truth.npz")
    if change.get("truth") == "none":
        tune = []
    if change.get("holdout") == "missing":
        holdout = [tmp_path / "nope" / "truth.npz"]
    if change.get("holdout") == "tuned":
        holdout = tune
    sweep = SWEEP
    if "space" in change:  # a sweep file whose search space holds a key the credit estimator never reads
        data = yaml.safe_load(SWEEP.read_text())
        data["search_space"][change["space"]] = {"type": "float", "low": 1e-6, "high": 1e-4, "log": True}
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(yaml.safe_dump(data))
    settings = [*_settings(tmp_path, tune, holdout), *([change["set"]] if "set" in change else [])]
    assert main([str(sweep), *settings]) == 2
    assert any(r.levelname == "ERROR" for r in caplog.records)
    assert re.search(message, caplog.text), caplog.text
    assert not (tmp_path / "optuna.db").exists()  # no study was created

    with pytest.raises(SweepSpecError, match=message):
        FidelityObjective(load_spec(sweep, settings))
