"""``import progpo`` caps oneDNN's primitive cache (bf16 CPU memory) unless the user chose a capacity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = "import torch, progpo, os; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"


def _capacity_seen(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if env_value is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = env_value
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_sets_a_small_cache_and_a_users_value_wins():
    assert _capacity_seen(None) == "32"
    assert _capacity_seen("1024") == "1024"
