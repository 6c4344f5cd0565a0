"""Helpers for tests that run several ranks on this machine, as torchrun would start them (gloo on CPU).

Each rank is a separate process with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
set, so Lightning sees processes created externally and joins them into one process group. Each rank leads its
own OS process group, so a test can SIGKILL them all, and none is left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args_of: Callable[[int], list[str]], world: int, cwd: Path, env: dict, logs: Path) -> list:
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    for rank in range(world):
        rank_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                    "RANK": str(rank), "LOCAL_RANK": str(rank), "NODE_RANK": "0", "OMP_NUM_THREADS": "1"}
        out = (logs / f"rank{rank}.log").open("w")
        # Each rank leads its own process group (with the children it starts), killed as one.
        procs.append(subprocess.Popen(args_of(rank), cwd=cwd, env=rank_env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def _kill(procs: list) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait(timeout=30)


def run_ranks(args_of: Callable[[int], list[str]], world: int, cwd: Path, env: dict, logs: Path,
              timeout_s: float = 600) -> list[int]:
    """Run ``world`` ranks to the end; their exit codes. A rank still running at the timeout: all are killed."""
    procs = _start(args_of, world, cwd, env, logs)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):  # one failed: the others would wait for it forever
                time.sleep(2)
                break
            time.sleep(0.2)
        return [p.poll() if p.poll() is not None else -9 for p in procs]
    finally:
        if any(p.poll() is None for p in procs):
            _kill(procs)


def kill_ranks_when(args_of: Callable[[int], list[str]], world: int, cwd: Path, env: dict, logs: Path,
                    ready: Callable[[], bool], timeout_s: float = 600) -> None:
    """Start ``world`` ranks, SIGKILL all of them as soon as ``ready()`` holds, and wait for them."""
    procs = _start(args_of, world, cwd, env, logs)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs) and not ready():
            time.sleep(0.2)
        assert all(p.poll() is None for p in procs), f"a rank ended before it could be killed: see {logs}"
    finally:
        _kill(procs)


def log_tail(logs: Path, lines: int = 30) -> str:
    return "\n".join(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-lines:])
                     for path in sorted(logs.glob("rank*.log")))
