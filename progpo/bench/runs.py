"""The run a model benchmark measures: ``python -m progpo.train``'s, built from the same Hydra overrides.

``bench iteration`` and ``bench decoding`` share it, so both measure exactly the run the overrides would train:
no logger, a temporary run folder, the engine and the env workers closed afterwards.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from omegaconf import DictConfig

from progpo.config import CONF_DIR


def add_run_arguments(parser: argparse.ArgumentParser, repeats_help: str) -> None:
    """The arguments every model benchmark takes: the run's overrides, how many repeats, torch's threads."""
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run, e.g. model=smollm2-135m")
    parser.add_argument("--repeats", type=int, default=2, help=repeats_help)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")


@contextmanager
def configured_run(overrides: list[str], threads: int = 0) -> Iterator[tuple[DictConfig, object]]:
    """``(cfg, run)``: ``progpo.train.build`` of the overrides with ``logger=none`` in a temporary folder; the
    collector's env workers and the engine are closed on exit, and the folder removed."""
    from hydra import compose, initialize_config_dir

    from progpo.train import build

    if threads:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="progpo-bench-") as tmp:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["logger=none", f"run_dir={tmp}/run", *overrides])
        run = build(cfg)
        try:
            yield cfg, run
        finally:
            run.collector.close()
            run.engine.close()
