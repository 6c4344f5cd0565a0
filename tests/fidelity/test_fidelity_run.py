"""``python -m progpo.fidelity`` for real: the tiny model on generated ALFWorld games and on the offline shop, a
real sqlite MLflow store, replays through the real env pool; bad input refused before anything is built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from progpo.config import ConfigError
from progpo.fidelity import FidelityTruth, build_estimators, measure
from progpo.fidelity.measure import take_fidelity_config
from progpo.rollout.collector import EpisodeStart
from progpo.train import build

REPO = Path(__file__).resolve().parents[2]
CONF = str(REPO / "conf")
SMALL = ["experiment=fast_dev", "fidelity.steps=6", "fidelity.continuations=2", "fidelity.bootstrap=100"]


def _cfg(overrides: list[str], config_name: str = "fidelity"):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides)


@pytest.mark.slow
def test_measures_alfworld_logs_to_mlflow_and_rescoring_the_truth_gives_the_same_numbers(tmp_path):
    run_dir = tmp_path / "fidelity"
    cfg = _cfg([*SMALL, f"run_dir={run_dir}", "run_name=fid-test",
                "fidelity.estimators=[grpo,gigpo,progpo,progpo_plain]"])
    result = measure(cfg)
    truth = result.truth
    assert truth.meta["steps_dropped"] == 0  # generated ALFWorld games replay exactly
    # the tiny model decodes only admissible commands: the action probabilities are exact, the complement applies
    assert truth.meta["truth_estimator"] == "complement" and truth.complement.all()
    assert ((0 < truth.p_action) & (truth.p_action <= 1)).all()
    assert len(truth.steps) == 6 and truth.q_returns.shape == (6, 2)
    assert truth.embedding is not None and truth.embedding.shape[0] == len(truth.t)
    assert result.timing["episodes"] == 24 and result.timing["replay_steps"] > 0
    for name in ("fidelity.md", "fidelity.csv", "fidelity_pairs.csv", "fidelity_scatter.png",
                 "fidelity_correlation.png", "truth.npz"):
        assert (run_dir / name).is_file(), name
    report = (run_dir / "fidelity.md").read_text()
    assert "progpo_plain" in report and "Noise floor" in report

    runs = mlflow.search_runs(experiment_names=["progpo"], output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["progpo.kind"] == "fidelity" and run.info.status == "FINISHED"
    assert run.data.metrics["fidelity/progpo/spearman"] == pytest.approx(
        result.scores.values["progpo"]["spearman"].value)
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "fidelity")}
    assert "fidelity/fidelity.md" in artifacts

    # Re-scoring the saved truth: the same numbers, without building anything.
    started = time.perf_counter()
    again = measure(_cfg(["fidelity.estimators=[grpo,gigpo,progpo,progpo_plain]", "fidelity.bootstrap=100",
                          f"fidelity.truth={run_dir / 'truth.npz'}", f"run_dir={tmp_path / 'rescored'}"]))
    assert time.perf_counter() - started < 10
    for name in ("grpo", "progpo", "progpo_plain"):
        np.testing.assert_array_equal(again.estimates[name], result.estimates[name])
        assert again.scores.values[name]["spearman"] == result.scores.values[name]["spearman"]


@pytest.mark.slow
def test_estimators_see_exactly_the_batch_training_learns_from(tmp_path):
    """The advantages an estimator gives in the fidelity measurement are those ``RLIteration.learn`` trains on."""
    cfg = _cfg(["experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}"], config_name="config")
    run = build(cfg)
    try:
        rl = run.module.rl
        batch = run.collector.collect(run.datamodule.train_batch().tasks, rl.group_size)
        # a barely trained fast-dev policy rarely wins: give one trajectory a win so that credit has work to do
        last = max((x for x in batch.turns if x.traj == 0), key=lambda x: x.t)
        last.reward = 10.0
        estimator = build_estimators(["progpo"], cfg)["progpo"]
        _, steps = rl.score(batch)
        measured = estimator(steps).advantage
        optimizer = torch.optim.SGD(rl.actor.parameters(), lr=0.0)
        trained = rl.learn(batch, 0, optimizer, lambda loss: loss.backward()).credit.advantage
    finally:
        run.collector.close()
        run.engine.close()
    torch.testing.assert_close(measured, trained, rtol=0, atol=0)
    assert (measured != 0).any()


@pytest.mark.slow
@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_replay_reproduces_recorded_observations_and_rewards(env, tmp_path):
    overrides = ["experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}", f"env={env}"]
    if env == "webshop":
        overrides += ["env.n_train=12", "env.n_eval=4", "env.max_steps=6"]
    run = build(_cfg(overrides, config_name="config"))
    try:
        batch = run.collector.collect(run.datamodule.train_batch().tasks, 2)
        starts = []
        for episode in batch.episodes:
            own = sorted((x for x in batch.turns if x.traj == episode.traj), key=lambda x: x.t)
            starts.append(EpisodeStart(episode.task, tuple(x.action for x in own), tuple(x.obs_id for x in own),
                                       tuple(x.reward for x in own)))
        played = run.collector.continue_from(starts)
    finally:
        run.collector.close()
        run.engine.close()
    for start, episode in zip(starts, played.episodes):
        assert episode.diverged_at is None
        assert episode.rewards == list(start.expected_rewards)
    assert played.timing.replay_steps == sum(len(s.actions) for s in starts)


@pytest.mark.parametrize(("override", "key"), [
    ("fidelity.estimators=[progpo,ppo]", "fidelity.estimators"),
    ("fidelity.estimators=[progpo_nothing]", "fidelity.estimators"),
    ("fidelity.steps=100000", "fidelity.steps"),
    ("fidelity.continuations=1", "fidelity.continuations"),
    ("env=webshop_real", "not deterministic"),
    ("fidelity.truth_estimator=exact", "fidelity.truth_estimator"),
])
def test_bad_input_fails_before_anything_is_built(override, key, tmp_path):
    cfg = _cfg(["experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}", override])
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        take_fidelity_config(cfg)
    assert time.perf_counter() - started < 5
    assert not (tmp_path / "run").exists()


def test_the_command_line_names_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "progpo.fidelity", "fidelity.continuations=1", "logger=none",
                           f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "fidelity.continuations" in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_truth_file_of_another_format_is_refused(tmp_path):
    np.savez(tmp_path / "old.npz", meta=np.array('{"format_version": 0}'))
    with pytest.raises(ValueError, match="format"):
        FidelityTruth.load(tmp_path / "old.npz")
    with pytest.raises(FileNotFoundError, match="progpo.fidelity"):
        FidelityTruth.load(tmp_path / "missing.npz")


def test_the_complement_estimator_needs_exact_action_probabilities():
    from progpo.fidelity.measure import _uses_complement

    class FreeDecoding:
        constrain_to_admissible = False

    class Constrained:
        constrain_to_admissible = True
        reasoning_tokens = 0

    class ConstrainedAfterThinking(Constrained):
        reasoning_tokens = 16

    with pytest.raises(ConfigError, match="fidelity.truth_estimator=sampled"):
        _uses_complement("complement", FreeDecoding())
    with pytest.raises(ConfigError, match="reasoning_tokens"):
        _uses_complement("complement", ConstrainedAfterThinking())
    assert _uses_complement("auto", FreeDecoding()) is False
    assert _uses_complement("auto", ConstrainedAfterThinking()) is False
    assert _uses_complement("auto", Constrained()) is True
    assert _uses_complement("sampled", Constrained()) is False
