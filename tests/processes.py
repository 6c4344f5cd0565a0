"""Helpers for tests that drive real ``python -m progpo.train`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def kill_when(args: list[str], cwd: Path, env: dict, ready: Callable[[], bool], timeout_s: float = 600) -> None:
    """Start ``args`` in its own process group, SIGKILL the group as soon as ``ready()`` holds, and wait for it.

    Fails if the process ends before ``ready()``; never leaves the process behind.
    """
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


_IMPORT_BASELINE: list[float] = []


def startup_bound_s(factor: float = 3.0, slack_s: float = 3.0) -> float:
    """A wall-clock bound for a start-up error, relative to this machine's cost of just importing the stack.

    A fixed bound fails on a loaded CI machine (a 12 s bound once failed at 13.2 s); the cost of
    ``import torch, lightning, progpo.train`` slows down with the same load, so ``factor`` times it stays a fair
    test of "fails before building anything" (building the envs and the model costs 30 s to minutes).
    Measured once per test session, in a fresh interpreter.
    """
    if not _IMPORT_BASELINE:
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch, lightning, progpo.train"], check=True,
                       capture_output=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
        _IMPORT_BASELINE.append(time.monotonic() - started)
    return factor * _IMPORT_BASELINE[0] + slack_s
