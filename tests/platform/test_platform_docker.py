"""The Docker files: no engine here, so the compose file is checked as data (and with `docker compose config`
when a compose-capable client exists)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from progpo.tracking import git_info

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_compose_services_wire_mlflow_postgres_and_trainer(compose):
    services = compose["services"]
    assert {"postgres", "mlflow", "trainer", "sweeper"} <= set(services)
    mlflow_cmd = " ".join(services["mlflow"]["command"])
    assert "--backend-store-uri=postgresql+psycopg2://" in mlflow_cmd and "@postgres:5432/mlflow" in mlflow_cmd
    assert "--artifacts-destination=/mlartifacts" in mlflow_cmd and "--serve-artifacts" in mlflow_cmd
    assert "mlflow:5000" in mlflow_cmd  # the Host header the trainer sends must be allowed
    assert "mlartifacts:/mlartifacts" in services["mlflow"]["volumes"]
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"

    for name in ("trainer", "sweeper"):  # both come from the x-trainer anchor
        env = services[name]["environment"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["OPTUNA_STORAGE"].startswith("postgresql+psycopg2://") and env["OPTUNA_STORAGE"].endswith("/optuna")
        assert services[name]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    assert services["trainer"]["command"][-1] == "experiment=paper_alfworld"
    assert "storage=$$OPTUNA_STORAGE" in services["sweeper"]["command"][-1]
    assert services["sweeper"]["profiles"] == ["sweep"]
    assert set(compose["volumes"]) == {"pgdata", "mlartifacts", "cache", "alfworld"}
    init = (DOCKER / "postgres-init" / "10-optuna.sql").read_text()
    assert "CREATE DATABASE optuna" in init


def test_build_files_exist_and_match(compose):
    for service in ("mlflow", "trainer"):
        build = compose["services"][service]["build"]
        dockerfile = (DOCKER / build["context"] / build["dockerfile"]).resolve()
        assert dockerfile.is_file(), dockerfile
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:12\.\S+-devel-ubuntu", gpu, re.M)
    assert "'.[vllm,gpu,postgres]'" in gpu and "ARG GIT_COMMIT" in gpu
    assert 'CMD ["python", "-m", "progpo.train", "experiment=paper_alfworld"]' in gpu
    ignored = (DOCKER / "Dockerfile.gpu.dockerignore").read_text().split()
    assert {".git", ".venv", "outputs"} <= set(ignored)


def test_sweeper_command_uses_a_real_sweep_file_and_experiment(compose):
    command = compose["services"]["sweeper"]["command"][-1]
    sweep_file = re.search(r"progpo\.sweep (\S+)", command).group(1)
    assert (REPO / sweep_file).is_file()
    experiment = re.search(r"experiment=(\w+)", command).group(1)
    assert (REPO / "conf" / "experiment" / f"{experiment}.yaml").is_file()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        paper = hydra_compose(config_name="config", overrides=["experiment=paper_alfworld"])
    assert paper.rollout.tasks_per_batch == 16 and paper.rollout.group_size == 8
    assert paper.optim.lr == pytest.approx(1e-6) and paper.ppo.kl_coef == pytest.approx(0.01)
    assert paper.schedule.max_iterations == 160 and paper.env.max_steps == 50 and paper.env.source == "official"


def test_git_commit_falls_back_to_the_build_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("PROGPO_GIT_COMMIT", "abc123")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_info(tmp_path).commit == "abc123"


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_config_when_the_client_supports_it():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("docker client without the compose plugin")
    done = subprocess.run(["docker", "compose", "-f", str(DOCKER / "docker-compose.yml"), "config", "--quiet"],
                          capture_output=True, text=True, cwd=DOCKER)
    assert done.returncode == 0, done.stderr
