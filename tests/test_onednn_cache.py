"""``import progpo`` sizes oneDNN's primitive cache for the CPU (small: bf16 memory; AMX-BF16: the padded batches'
few shapes kept) unless the user chose a capacity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from progpo import hardware

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


def test_import_sets_this_cpus_capacity_and_a_users_value_wins():
    assert _capacity_seen(None) == str(hardware.onednn_cache_capacity())
    assert _capacity_seen("77") == "77"


def test_the_capacity_is_small_but_on_amx_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_bf16"}))
    assert hardware.onednn_cache_capacity() == 1024
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert hardware.onednn_cache_capacity() == 32
    monkeypatch.setattr(hardware, "cpu_flags", lambda: None)  # not Linux: unknown
    assert hardware.onednn_cache_capacity() == 32
