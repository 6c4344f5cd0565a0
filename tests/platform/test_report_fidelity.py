"""Table 4 (credit fidelity) of ``progpo.report`` from fidelity runs logged as ``python -m progpo.fidelity`` logs
them: the real ``make_logger`` on a real sqlite store, the tags of ``progpo.fidelity.outputs.write_outputs`` and the
metrics of ``metrics_for_logger`` computed by the real bootstrap scoring on synthetic advantages (no model)."""

from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.stats import t as student_t
from test_platform_report import REPORT_FILES, _log_run

from progpo.fidelity.outputs import metrics_for_logger
from progpo.fidelity.scoring import noise_floor, score
from progpo.report import make_report
from progpo.tracking import KIND_TAG, make_logger

EXPERIMENT = "laptop_alfworld"
ESTIMATORS = ("progpo", "grpo", "gigpo")  # scored in this order; Table 4 lists grpo, gigpo, progpo
NOISE = {"grpo": 2.0, "gigpo": 1.0, "progpo": 0.4}  # the estimate's noise around the truth: smaller is truer
STEPS = 40
TABLE4_FILES = ("table4_fidelity.md", "table4_fidelity.csv", "table4_fidelity_runs.csv")


def _log_fidelity_run(uri: str, seed: int, iteration: int, *, draw: int = 0, status: str = "FINISHED",
                      experiment: str = EXPERIMENT) -> tuple[str, dict[str, float]]:
    """One fidelity run: tags and metrics exactly as ``write_outputs`` logs them (synthetic advantages)."""
    cfg = OmegaConf.create({"seed": seed, "env": {"name": "alfworld"}, "model": {"name": "tiny"},
                            "credit": {"name": "progpo"}})
    logger = make_logger(cfg, uri, experiment, tags={KIND_TAG: "fidelity"}, retries=2, backoff_s=0.0,
                         log_config=False)
    rng = np.random.default_rng([seed, iteration, draw])
    hat = rng.normal(size=STEPS)
    se = np.full(STEPS, 0.15)
    sharper = 1 + iteration / 6  # a trained policy's batch: every estimator a little closer to the truth
    estimates = {name: hat + rng.normal(scale=NOISE[name] / sharper, size=STEPS) for name in ESTIMATORS}
    result = SimpleNamespace(scores=score(estimates, hat, se, resamples=200, seed=seed),
                             floor=noise_floor(hat, se, draws=50, seed=seed), timing={"collect_s": 1.5})
    policy = "as built" if iteration == 0 else f"outputs/runs/progpo-alfworld-tiny-seed{seed}/checkpoints/last.ckpt"
    logger.set_tags({"fidelity.policy": policy, "fidelity.iteration": iteration, "fidelity.steps": STEPS,
                     "fidelity.continuations": 4})
    metrics = metrics_for_logger(result)
    logger.log_metrics(metrics, step=0)
    logger.end_run(status)
    return logger.run_id, metrics


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its tables and no runs: creating the tables takes seconds, copying it none."""
    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def _new_store(empty_db: Path, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{shutil.copy(empty_db, folder / 'mlflow.db')}"


def _log_training_runs(client, experiment: str) -> None:
    exp = client.create_experiment(experiment)
    for seed, (g, p) in enumerate([(0.5, 0.75), (0.7, 0.95)]):
        _log_run(client, exp, "grpo", seed, g)
        _log_run(client, exp, "progpo", seed, p)


@pytest.fixture(scope="module")
def store(empty_db, tmp_path_factory):
    """Experiment ``laptop_alfworld``: training runs (two methods x two seeds) and fidelity runs (3 seeds x warm
    start and iteration 6 x 3 estimators), seed 0 at iteration 6 measured twice (the later run counts), one fidelity
    run FAILED. Experiment ``training_only``: the same training runs alone."""
    uri = _new_store(empty_db, tmp_path_factory.mktemp("store"))
    client = mlflow.MlflowClient(uri)
    _log_training_runs(client, EXPERIMENT)
    _log_training_runs(client, "training_only")
    fidelity: dict[tuple[int, int], dict[str, float]] = {}
    _log_fidelity_run(uri, 0, 6, draw=1)  # an earlier measurement of seed 0's trained policy: replaced below
    time.sleep(0.01)
    for seed in range(3):
        for iteration in (0, 6):
            fidelity[(seed, iteration)] = _log_fidelity_run(uri, seed, iteration)[1]
    _log_fidelity_run(uri, 3, 0, status="FAILED")
    return uri, client, fidelity


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _expected(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample std and the 95% t-interval half-width over seeds, computed plainly."""
    mean, std = statistics.fmean(values), statistics.stdev(values)
    return mean, std, float(student_t.ppf(0.975, len(values) - 1)) * std / math.sqrt(len(values))


def test_fidelity_runs_are_table4_and_leave_tables_1_to_3_alone(store, tmp_path):
    uri, client, fidelity = store
    with_fidelity = make_report(EXPERIMENT, tmp_path / "out", tracking_uri=uri)
    assert with_fidelity.n_runs == 4 and with_fidelity.n_fidelity_runs == 7
    assert with_fidelity.left_out == {} and with_fidelity.fidelity_left_out == {"FAILED": 1}
    names = {p.name for p in with_fidelity.figures}
    assert names == {"fig4_success_alfworld.png", "fig5_credit_alfworld.png", "fig6_fidelity_alfworld.png"}

    # Tables 1-3 and Figures 4-5 are those of the training runs alone.
    plain = make_report("training_only", tmp_path / "plain", tracking_uri=uri, upload=False)
    assert plain.n_fidelity_runs == 0 and not (tmp_path / "plain" / "table4_fidelity.md").exists()
    for name in REPORT_FILES:
        assert (tmp_path / "out" / name).read_text() == (tmp_path / "plain" / name).read_text(), name
    assert "fidelity" not in json.loads((tmp_path / "plain" / "runs.json").read_text())  # the old format

    # Table 4 against a plain computation: each seed's point value, latest run per seed and policy.
    table = {(r["estimator"], r["policy"], r["metric"]): r for r in _rows(tmp_path / "out" / "table4_fidelity.csv")}
    policies = {0: "warm start (iteration 0)", 6: "iteration 6"}
    for estimator in (*ESTIMATORS, "noise_floor"):
        for iteration, policy in policies.items():
            for metric in ("spearman", "sign_agreement"):
                values = [fidelity[(seed, iteration)][f"fidelity/{estimator}/{metric}"] for seed in range(3)]
                mean, std, ci95 = _expected(values)
                row = table[(estimator, policy, metric)]
                assert row["n"] == "3" and row["iteration"] == str(iteration)
                assert float(row["mean"]) == pytest.approx(mean, rel=1e-9)
                assert float(row["std"]) == pytest.approx(std, rel=1e-9)
                assert float(row["ci95"]) == pytest.approx(ci95, rel=1e-9)
    assert len(table) == 4 * 2 * 2
    warm = table[("progpo", policies[0], "spearman")]
    assert float(table[("grpo", policies[0], "spearman")]["mean"]) < float(warm["mean"])  # noisier, less true

    markdown = (tmp_path / "out" / "table4_fidelity.md").read_text()
    assert markdown.startswith("### Table 4: credit fidelity")
    header = ("| env | estimator | warm start (iteration 0): Spearman | warm start (iteration 0): sign agreement | "
              "warm start (iteration 0): n | iteration 6: Spearman | iteration 6: sign agreement | iteration 6: n |")
    assert header in markdown
    order = [line.split(" | ")[1] for line in markdown.splitlines() if line.startswith("| alfworld |")]
    assert order == ["grpo", "gigpo", "progpo", "noise floor"]
    mean, std, ci95 = _expected([fidelity[(s, 6)]["fidelity/progpo/spearman"] for s in range(3)])
    cell = f"{mean:.3f} ± {std:.3f} [{mean - ci95:.3f}, {mean + ci95:.3f}]"
    assert f"| {cell} |" in markdown
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Fidelity runs: left out 1 run(s) that did not finish: 1 FAILED" in report
    assert "4 runs and 7 credit-fidelity runs (Table 4)" in report and "fig6_fidelity_alfworld.png" in report
    assert report.index("### Table 4") > report.index("### Table 2")

    # The per-run CSV: every run x estimator with its bootstrap interval; the replaced measurement not counted.
    runs = _rows(tmp_path / "out" / "table4_fidelity_runs.csv")
    assert len(runs) == 7 * 4  # 7 FINISHED runs x (3 estimators + noise floor)
    replaced = [r for r in runs if r["seed"] == "0" and r["policy"] == "iteration 6" and r["counted"] == "false"]
    assert len(replaced) == 4 and all(r["checkpoint"].endswith("seed0/checkpoints/last.ckpt") for r in replaced)
    row = next(r for r in runs if (r["seed"], r["policy"], r["estimator"], r["counted"])
               == ("1", "iteration 6", "gigpo", "true"))
    metrics = fidelity[(1, 6)]
    assert float(row["spearman"]) == pytest.approx(metrics["fidelity/gigpo/spearman"], rel=1e-9)
    assert float(row["spearman_low"]) == pytest.approx(metrics["fidelity/gigpo/spearman_low"], rel=1e-9)
    assert float(row["sign_agreement_high"]) == pytest.approx(metrics["fidelity/gigpo/sign_agreement_high"],
                                                              rel=1e-9)
    assert row["steps"] == str(STEPS) and row["checkpoint"]
    floor = next(r for r in runs if r["estimator"] == "noise_floor" and r["counted"] == "true")
    assert floor["spearman"] and floor["spearman_low"] == "" and floor["checkpoint"] == ""  # a warm start first

    artifacts = {a.path for a in client.list_artifacts(with_fidelity.report_run_id, "report")}
    assert {"report/table4_fidelity.md", "report/fig6_fidelity_alfworld.png"} <= artifacts
    png = (tmp_path / "out" / "fig6_fidelity_alfworld.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_runs_json_rebuilds_table4_exactly(store, empty_db, tmp_path):
    uri, _, _ = store
    make_report(EXPERIMENT, tmp_path / "first", tracking_uri=uri, upload=False)
    archive = tmp_path / "first" / "runs.json"
    payload = json.loads(archive.read_text())
    assert payload["version"] == 1 and len(payload["runs"]) == 4 and len(payload["fidelity"]) == 7
    run = payload["fidelity"][0]
    assert run["tags"][KIND_TAG] == "fidelity" and "fidelity.iteration" in run["tags"]
    assert not any(key.startswith("mlflow.") for key in run["tags"])
    assert all(key.startswith("fidelity/") for key in run["metrics"])

    fresh = _new_store(empty_db, tmp_path / "clone")  # another clone: no experiment at all
    rebuilt = make_report(EXPERIMENT, tmp_path / "rebuilt", tracking_uri=fresh, archives=[archive])
    assert rebuilt.n_runs == 4 and rebuilt.n_fidelity_runs == 7 and rebuilt.report_run_id is None
    for name in (*REPORT_FILES, *TABLE4_FILES, "runs.json"):
        assert (tmp_path / "rebuilt" / name).read_text() == (tmp_path / "first" / name).read_text(), name
    # the store and the archive both hold them: each run counts once
    both = make_report(EXPERIMENT, tmp_path / "both", tracking_uri=uri, upload=False, archives=[archive])
    assert both.n_fidelity_runs == 7
    for name in TABLE4_FILES:
        assert (tmp_path / "both" / name).read_text() == (tmp_path / "first" / name).read_text(), name


def test_old_archives_without_fidelity_runs_still_load(empty_db, tmp_path):
    """A committed runs.json written before Table 4 (no ``fidelity`` key) rebuilds as before."""
    archives = sorted(Path(__file__).resolve().parents[2].glob("docs/results/*/runs.json"),
                      key=lambda p: p.stat().st_size)
    assert archives
    archive = archives[0]  # the smallest: fast
    experiment = json.loads(archive.read_text())["experiment"]
    files = make_report(experiment, tmp_path / "out", tracking_uri=_new_store(empty_db, tmp_path / "clone"),
                        archives=[archive])
    assert files.n_runs > 0 and files.n_fidelity_runs == 0
    assert not (tmp_path / "out" / "table4_fidelity.md").exists()
    written = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert "fidelity" not in written and len(written["runs"]) == files.n_runs


def test_an_experiment_of_fidelity_runs_alone_has_table4_only(store, tmp_path):
    uri = store[0]
    for seed in range(2):
        _log_fidelity_run(uri, seed, 0, experiment="warm_start_only")
    files = make_report("warm_start_only", tmp_path / "out", tracking_uri=uri, upload=False)
    assert files.n_runs == 0 and files.n_fidelity_runs == 2
    assert sorted(p.name for p in files.figures) == ["fig6_fidelity_alfworld.png"]
    assert not (tmp_path / "out" / "table1_success.md").exists()
    rows = _rows(tmp_path / "out" / "table4_fidelity.csv")
    assert {r["policy"] for r in rows} == {"warm start (iteration 0)"} and {r["n"] for r in rows} == {"2"}
    with pytest.raises(ValueError, match="no FINISHED training runs in group 'other' nor fidelity runs"):
        make_report("warm_start_only", tmp_path / "none", tracking_uri=uri, upload=False, group="other")
