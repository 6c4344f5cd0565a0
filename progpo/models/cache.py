"""Content-keyed cache of built models under ``$PROGPO_CACHE_DIR`` (default ``~/.cache/progpo``).

A folder is named by a hash of everything that went into the build, written under a temporary name and
renamed into place (atomic on one file system), and guarded by a file lock so that two processes asking
for the same model build it once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from envs.base import cache_root

log = logging.getLogger(__name__)

COMPLETE = "progpo-build.json"  # written last inside a build folder: its presence marks a finished build


def build_key(params: dict[str, Any]) -> str:
    """Stable short hash of JSON-serialisable build parameters."""
    blob = json.dumps(params, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def cached_build(kind: str, params: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return the folder for ``params``, calling ``build(tmp_dir)`` to fill it if it is not cached yet.

    ``build`` writes everything into the folder it gets and returns a JSON-serialisable summary, stored
    next to the parameters in ``progpo-build.json``. It runs with the global RNG states saved and restored, so a
    run that builds its model draws the same random numbers afterwards as a run that finds it cached.
    """
    root = cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{kind}-{build_key(params)}"
    with FileLock(str(final) + ".lock"):
        if (final / COMPLETE).exists():
            log.info("re-using cached %s model from %s", kind, final)
            return final
        # Holding the lock, no one else is building this key: anything left is from a killed build.
        for stale in [final, *root.glob(f".{final.name}.*")]:
            if stale.exists():
                log.warning("removing the leftovers of an interrupted build: %s", stale)
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            with _rng_kept():
                summary = build(tmp)
            (tmp / COMPLETE).write_text(
                json.dumps({"params": params, "summary": summary}, indent=2, default=str)
            )
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("built %s model into %s", kind, final)
    return final


@contextlib.contextmanager
def _rng_kept():
    """torch (CPU and CUDA), numpy and Python RNG states as they were before the block."""
    import random

    import numpy as np
    import torch

    py, npy = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(py)
    np.random.set_state(npy)
