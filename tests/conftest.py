"""Test isolation: every test runs with HOME, MLflow and Hydra output pointed at temp dirs."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # shared helpers (processes.py) for every test folder


@pytest.fixture(scope="session")
def shared_cache_dir(tmp_path_factory):
    """One cache (generated games, tokenizers, warm starts) shared by the whole test session."""
    return tmp_path_factory.mktemp("progpo-cache")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch, shared_cache_dir):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("PROGPO_CACHE_DIR", str(shared_cache_dir))
    yield


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a set-up error reported elsewhere
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_vllm = pytest.mark.skip(reason="needs vllm (run `make test-vllm`)")
    has_vllm = importlib.util.find_spec("vllm") is not None
    has_cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(skip_vllm)


os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
