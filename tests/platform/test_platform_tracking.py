"""MLflow tracking against real stores: a sqlite file and a real `mlflow server` process."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml
from hydra.utils import instantiate
from lightning.pytorch.demos.boring_classes import BoringModel
from omegaconf import OmegaConf
from platform_helpers import free_port

from progpo.tracking import (
    EXPERIMENT_KIND_TAG,
    KIND_TAG,
    ProGPOMLFlowLogger,
    TrackingUnavailableError,
    flatten_params,
    log_checkpoint,
    log_figure,
    log_trajectories,
    make_logger,
    run_status,
)

REPO = Path(__file__).resolve().parents[2]


def _cfg(**extra):
    data = {
        "seed": 3,
        "objective": "val/success",
        "credit": {"_target_": "progpo.credit.ProGPO", "history": 2, "lambda_tr": 0.5},
        "trainer": {"max_iterations": 2, "lr": 1e-6},
        "rollout": {"group_size": 8, "stops": ["</action>", "\n\n"]},
        "notes": "x" * 7000,
    }
    data.update(extra)
    return OmegaConf.create(data)


def _uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"


def _fast(**kwargs) -> dict:
    return {"retries": 2, "backoff_s": 0.0, **kwargs}


def test_new_run_records_params_tags_and_config(tmp_path):
    cfg = _cfg()
    logger = make_logger(cfg, tracking_uri=_uri(tmp_path), experiment_name="exp-a", group="g1",
                         tags={"purpose": "test"}, **_fast())
    client = mlflow.MlflowClient(_uri(tmp_path))
    run = client.get_run(logger.run_id)
    params, tags = run.data.params, run.data.tags
    assert params["credit.history"] == "2" and params["trainer.lr"] == "1e-06"
    assert params["rollout.stops"] == '["</action>", "\\n\\n"]'
    assert len(params["notes"]) == 6000 and params["notes"].endswith("...")  # clipped to MLflow's limit
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert tags["git_commit"] == head == tags["mlflow.source.git.commit"]
    assert tags["method"] == "progpo" and tags["seed"] == "3" and tags["group"] == "g1"
    assert tags["purpose"] == "test" and tags[KIND_TAG] == "train"
    assert client.get_experiment(run.info.experiment_id).name == "exp-a"
    saved = yaml.safe_load(Path(client.download_artifacts(logger.run_id, "config/config.yaml", str(tmp_path))).read_text())
    assert saved == OmegaConf.to_container(cfg)

    logger.log_metrics({"train/success": 0.25}, step=1)
    logger.log_metrics({"train/success": 0.5}, step=2)
    logger.end_run("FINISHED")
    history = client.get_metric_history(logger.run_id, "train/success")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_logger_yaml_instantiates_with_the_whole_config(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _uri(tmp_path))
    node = OmegaConf.load(REPO / "conf" / "logger" / "mlflow.yaml")
    cfg = _cfg(logger=node)
    logger = instantiate(cfg.logger, cfg=cfg)
    assert isinstance(logger, ProGPOMLFlowLogger)
    assert logger.tracking_uri == _uri(tmp_path)
    run = mlflow.MlflowClient(_uri(tmp_path)).get_run(logger.run_id)
    assert run.data.params["logger.experiment_name"] == "progpo"
    assert run.data.tags["group"] == "progpo"  # no group and no multirun: the experiment name


def test_flatten_params_sanitises_keys():
    flat = flatten_params({"a": {"b@c": 1, "empty": {}}, "hydra": {"x": 1}})
    assert flat == {"a.b_c": "1", "a.empty": "{}"}


def test_unreachable_server_fails_fast_naming_the_key(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=r"logger\.tracking_uri='http://127\.0\.0\.1:\d+'"):
        make_logger(_cfg(), tracking_uri=uri, experiment_name="x")
    assert time.monotonic() - start < 3.0


def test_transient_failures_are_retried(tmp_path, caplog):
    logger = make_logger(_cfg(), tracking_uri=_uri(tmp_path), experiment_name="retry", **_fast())
    real = logger.client.log_batch
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("simulated network blip")
        return real(*args, **kwargs)

    logger.client.log_batch = flaky
    with caplog.at_level(logging.INFO, logger="progpo.tracking"):
        logger.log_metrics({"loss/policy": 1.5}, step=4)
    assert calls["n"] == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no warning: the 3rd try worked
    history = mlflow.MlflowClient(_uri(tmp_path)).get_metric_history(logger.run_id, "loss/policy")
    assert [(m.step, m.value) for m in history] == [(4, 1.5)]


def test_persistent_failure_warns_and_never_raises(tmp_path, caplog):
    logger = make_logger(_cfg(), tracking_uri=_uri(tmp_path), experiment_name="retry", **_fast())

    def down(*args, **kwargs):
        raise ConnectionError("store is down")

    logger.client.log_batch = down
    logger.client.log_table = down
    with caplog.at_level(logging.WARNING, logger="progpo.tracking"):
        logger.log_metrics({"loss/policy": 1.0}, step=1)  # must not raise
        log_trajectories(logger, [{"prompt": "p"}], iteration=1)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("giving up on log metrics after 3 attempt(s)" in m for m in messages)
    assert any("giving up on log trajectories" in m for m in messages)


def test_resume_continues_the_same_run(tmp_path):
    uri = _uri(tmp_path)
    first = make_logger(_cfg(), tracking_uri=uri, experiment_name="resume", **_fast())
    first.log_metrics({"train/success": 0.1}, step=1)
    first.finalize("failed")
    client = mlflow.MlflowClient(uri)
    assert client.get_run(first.run_id).info.status == "FAILED"

    second = make_logger(_cfg(), tracking_uri=uri, experiment_name="resume", run_id=first.run_id, **_fast())
    assert second.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "RUNNING"
    second.log_metrics({"train/success": 0.2}, step=2)
    second.end_run("FINISHED")
    history = client.get_metric_history(first.run_id, "train/success")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2)]
    artifacts = [a.path for a in client.list_artifacts(first.run_id, "config")]
    assert "config/config.yaml" in artifacts and any("config-resume-" in a for a in artifacts)
    assert len(client.search_runs([client.get_experiment_by_name("resume").experiment_id])) == 1


def test_resume_with_unknown_run_id_names_the_key(tmp_path):
    make_logger(_cfg(), tracking_uri=_uri(tmp_path), experiment_name="resume", **_fast())
    with pytest.raises(TrackingUnavailableError, match=r"logger\.run_id='0123456789abcdef0123456789abcdef'"):
        make_logger(_cfg(), tracking_uri=_uri(tmp_path), experiment_name="resume",
                    run_id="0123456789abcdef0123456789abcdef", **_fast())


def test_trajectories_figure_and_checkpoint(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    logger = make_logger(_cfg(), tracking_uri=_uri(tmp_path), experiment_name="art", **_fast())
    rows = [
        {"t": 0, "prompt": "You are in a room.", "response": "<action>go to desk 1</action>",
         "action": "go to desk 1", "valid": True, "reward": 0.0, "advantage": torch.tensor(0.3),
         "adv/hier": 0.2, "adv/trans": 0.1},
        {"t": 1, "prompt": "On the desk...", "response": "dance", "action": "dance", "valid": False,
         "reward": -0.1, "advantage": -0.5, "adv/hier": -0.5, "adv/trans": 0.0},
    ]
    artifact = log_trajectories(logger, rows, iteration=7)
    assert artifact == "trajectories/iter_000007.json"
    path = mlflow.MlflowClient(_uri(tmp_path)).download_artifacts(logger.run_id, artifact, str(tmp_path))
    table = pd.read_json(path, orient="split")
    assert list(table.columns[:7]) == ["iteration", "t", "prompt", "response", "action", "valid", "reward"]
    assert table["iteration"].tolist() == [7, 7]
    assert table["valid"].tolist() == [True, False]
    assert table["advantage"].tolist() == pytest.approx([0.3, -0.5])

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0.2, 0.4])
    assert log_figure(logger, fig, "success curve") == "plots/success_curve.png"
    plt.close(fig)
    log_checkpoint(logger, tmp_path / "ckpt" / "last.ckpt", iteration=7)
    client = mlflow.MlflowClient(_uri(tmp_path))
    assert [a.path for a in client.list_artifacts(logger.run_id, "plots")] == ["plots/success_curve.png"]
    tags = client.get_run(logger.run_id).data.tags
    assert tags["checkpoint_path"] == str((tmp_path / "ckpt" / "last.ckpt").resolve())
    assert tags["checkpoint_iteration"] == "7"


def test_helpers_are_noops_without_an_mlflow_logger():
    assert log_trajectories(None, [{"prompt": "p"}], iteration=0) is None
    assert log_figure(None, object(), "x") is None
    log_checkpoint(None, "x.ckpt")
    with pytest.raises(ValueError, match="iteration must be >= 0"):
        log_trajectories(None, [], iteration=-1)


@pytest.mark.slow
def test_logging_to_a_real_mlflow_server(tmp_path, mlflow_server_uri):
    logger = make_logger(_cfg(), tracking_uri=mlflow_server_uri, experiment_name="served", group="srv", **_fast())
    logger.log_metrics({"val/success": 0.75}, step=3)
    log_trajectories(logger, [{"prompt": "p", "response": "r", "action": "a", "valid": True, "reward": 1.0}], 3)
    logger.end_run("FINISHED")
    client = mlflow.MlflowClient(mlflow_server_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["val/success"] == 0.75
    assert run.data.tags["group"] == "srv"
    assert {a.path for a in client.list_artifacts(logger.run_id)} >= {"config", "trajectories"}


@pytest.mark.slow
def test_tracking_store_on_postgresql(postgres_url):
    """MLflow's own schema on PostgreSQL (what the compose mlflow server uses as its backend store)."""
    uri = f"{postgres_url}/mlflow"
    logger = make_logger(_cfg(), tracking_uri=uri, experiment_name="pg", **_fast())
    logger.log_metrics({"val/success": 0.5}, step=1)
    logger.end_run("FINISHED")
    run = mlflow.MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["val/success"] == 0.5
    assert run.data.params["credit.history"] == "2"


# ----------------------------------------------------------------------------------------------- run status


class _Boom(RuntimeError):
    pass


class _RaisingModel(BoringModel):
    def training_step(self, batch, batch_idx):
        raise _Boom("training blew up")


def _trainer(logger, **kwargs):
    import lightning as L

    return L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=logger,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, **kwargs)


def test_status_follows_the_runs_life_not_lightnings_teardown(tmp_path):
    """Lightning calls finalize("success") after every validate and fit: the run stays RUNNING until end_run."""
    uri = _uri(tmp_path)
    client = mlflow.MlflowClient(uri)
    logger = make_logger(_cfg(), tracking_uri=uri, experiment_name="life", **_fast())
    model = BoringModel()
    _trainer(logger).validate(model, verbose=False)  # the start-of-run evaluation
    assert client.get_run(logger.run_id).info.status == "RUNNING"
    _trainer(logger).fit(model)
    assert client.get_run(logger.run_id).info.status == "RUNNING"
    with run_status(logger):
        _trainer(logger).validate(model, verbose=False)  # the final evaluation
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_a_run_that_raises_is_failed_with_its_error(tmp_path):
    uri = _uri(tmp_path)
    logger = make_logger(_cfg(), tracking_uri=uri, experiment_name="life", **_fast())
    with pytest.raises(_Boom), run_status(logger):
        _trainer(logger).fit(_RaisingModel())
    run = mlflow.MlflowClient(uri).get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == "_Boom: training blew up"


def test_an_interrupted_run_is_killed_and_none_logger_is_a_noop(tmp_path):
    uri = _uri(tmp_path)
    logger = make_logger(_cfg(), tracking_uri=uri, experiment_name="life", **_fast())
    with pytest.raises(SystemExit), run_status(logger):
        raise SystemExit(1)  # what Lightning raises after Ctrl+C or SIGTERM
    assert mlflow.MlflowClient(uri).get_run(logger.run_id).info.status == "KILLED"
    with run_status(None):
        pass
    with pytest.raises(ValueError, match="status must be one of FINISHED, FAILED, KILLED"):
        logger.end_run("DONE")


def test_runs_are_named_after_the_config_and_distinct(tmp_path):
    uri = _uri(tmp_path)
    names = []
    for seed in (0, 1):
        cfg = _cfg(seed=seed, run_name=f"progpo-alfworld-tiny-seed{seed}")
        names.append(mlflow.MlflowClient(uri).get_run(
            make_logger(cfg, tracking_uri=uri, experiment_name="names", **_fast()).run_id).info.run_name)
    assert names == ["progpo-alfworld-tiny-seed0", "progpo-alfworld-tiny-seed1"]
    explicit = make_logger(_cfg(run_name="x"), tracking_uri=uri, experiment_name="names", run_name="mine", **_fast())
    assert mlflow.MlflowClient(uri).get_run(explicit.run_id).info.run_name == "mine"  # the run_name argument wins


def test_artifacts_stay_with_the_sqlite_store_and_the_experiment_is_classic_ml(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # MLflow's own default would be ./mlruns here
    uri = _uri(tmp_path)
    logger = make_logger(_cfg(), tracking_uri=uri, experiment_name="my exp/1", **_fast())
    client = mlflow.MlflowClient(uri)
    run = client.get_run(logger.run_id)
    store = tmp_path / "store"
    assert run.info.artifact_uri.startswith((store / "mlartifacts" / "my_exp_1").as_uri())
    assert (store / "mlartifacts" / "my_exp_1" / run.info.run_id / "artifacts" / "config" / "config.yaml").is_file()
    assert not (work / "mlruns").exists()
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"

    old = client.create_experiment("made elsewhere")  # e.g. by an older version: gets the tag on first use
    make_logger(_cfg(), tracking_uri=uri, experiment_name="made elsewhere", **_fast())
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


FIRST_RUN = """
import sys, time
from omegaconf import OmegaConf
from progpo.tracking.mlflow_logger import make_logger
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # every process reaches the fresh store at the same moment
logger = make_logger(OmegaConf.create({"seed": int(sys.argv[3])}), sys.argv[1], experiment_name="race",
                     run_name=f"job{sys.argv[3]}", retries=0, log_config=False)
logger.end_run("FINISHED")
"""


def test_parallel_jobs_on_a_fresh_sqlite_store_all_start(tmp_path):
    """The jobs of a parallel multirun (hydra/launcher=joblib) create their runs on a store nobody made yet: the
    first one builds MLflow's tables under a lock, the others wait and use them (no retries allowed here)."""
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    start = time.time() + 12  # past the imports of every process
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_RUN, uri, str(start), str(i)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-2000:] for o in outputs)
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["job0", "job1", "job2"]
    assert {r.info.status for r in runs} == {"FINISHED"}
