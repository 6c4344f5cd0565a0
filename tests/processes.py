"""Helpers for tests that drive real ``python -m progpo.train`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
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
