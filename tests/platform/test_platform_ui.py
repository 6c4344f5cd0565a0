"""The MLflow UI in headless Chromium (`scripts/mlflow_ui_screenshot.sh`): a real server over a real sqlite store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from omegaconf import OmegaConf

from progpo.tracking import make_logger

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "mlflow_ui_screenshot.sh"
RUNS = [("progpo", 0, "FINISHED"), ("grpo", 1, "FAILED"), ("gigpo", 2, None), ("hgpo", 3, "KILLED")]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_runs_table_shows_named_runs_not_the_genai_overview(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    for credit, seed, status in RUNS:
        cfg = OmegaConf.create({"seed": seed, "credit": {"_target_": f"progpo.credit.{credit}"},
                                "run_name": f"{credit}-alfworld-tiny-seed{seed}"})
        logger = make_logger(cfg, tracking_uri=uri, experiment_name="compare_methods", retries=0)
        logger.log_metrics({"val/success": seed / 4}, step=1)
        if status:
            logger.end_run(status)  # the gigpo run stays RUNNING
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("compare_methods").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED", "KILLED", "RUNNING"]

    png, dom = tmp_path / "runs.png", tmp_path / "runs.html"
    env = dict(os.environ, PYTHON=sys.executable, DOM_OUT=str(dom))
    done = subprocess.run([str(SCRIPT), uri, "compare_methods", str(png)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    page = dom.read_text()
    for credit, seed, _ in RUNS:
        assert page.count(f">{credit}-alfworld-tiny-seed{seed}<") == 1  # each run once, under its own name
    assert "<strong>4</strong> matching runs" in page  # the runs table ...
    assert "Detect Issues" not in page  # ... not the GenAI overview (traces, judges)
