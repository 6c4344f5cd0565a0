"""Bad input fails at start-up: exit code 2, the key or file named, in seconds, with nothing built or written.

Real subprocesses of ``python -m progpo.train`` (the user's command), timed from launch.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from processes import startup_bound_s

REPO = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "progpo.train", f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'h'}",
         *overrides],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("env.source=offical", "env.source"),
        ("env.invalid_action=foo", "env.invalid_action"),
        ("ckpt_path=/nonexistent/last.ckpt", "ckpt_path=/nonexistent/last.ckpt"),
        pytest.param("trainer=gpu", "trainer.accelerator=gpu", marks=pytest.mark.skipif(
            torch.cuda.is_available(), reason="needs a machine without CUDA")),
    ],
)
def test_bad_input_stops_with_rc_2_before_anything_is_built(tmp_path, override, named):
    proc, elapsed = _train(tmp_path, override)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert named in output
    assert "building environment suite" not in output
    assert not (tmp_path / "run").exists()  # nothing written
    assert elapsed < startup_bound_s(), f"took {elapsed:.1f}s, bound {startup_bound_s():.1f}s"


@pytest.mark.parametrize("content", [b"", b"this is not a checkpoint"])
def test_an_empty_or_corrupt_checkpoint_is_named(tmp_path, content):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(content)
    proc, elapsed = _train(tmp_path, f"ckpt_path={bad}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert f"checkpoint {bad} cannot be read" in output and "empty or corrupt" in output
    assert "EOFError: Ran out of input" not in output.splitlines()[-1]
    assert not (tmp_path / "run").exists()
    assert elapsed < startup_bound_s(), f"took {elapsed:.1f}s, bound {startup_bound_s():.1f}s"


def test_an_unreachable_tracking_server_stops_the_run_before_the_envs_and_model(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc, elapsed = _train(tmp_path, f"logger.tracking_uri=http://127.0.0.1:{port}", "logger.connect_timeout_s=2")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert "logger.tracking_uri" in output
    assert "building environment suite" not in output  # the tracking check comes first
    assert elapsed < startup_bound_s(slack_s=5.0), f"took {elapsed:.1f}s"
