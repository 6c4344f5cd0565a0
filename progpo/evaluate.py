"""`python -m progpo.evaluate`: held-out success of the configured model as it is (zero-shot for a pretrained
model, the warm start for ``tiny``), with no training. Takes the same overrides as ``progpo.train``; the metrics
go to the logger and ``<run_dir>/metrics.jsonl`` like a training run's step-0 evaluation.

    python -m progpo.evaluate model=smollm2-135m env.n_eval=16 eval.temperature=0.4 logger=none
"""

from __future__ import annotations

import logging
import os

import hydra
from omegaconf import DictConfig

from progpo.config import ConfigError
from progpo.train import build

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """One held-out evaluation of the model as built; returns its ``val/*`` metrics."""
    run = build(cfg)
    try:
        run.trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    finally:
        run.collector.close()
        run.engine.close()
    metrics = dict(run.record.last_eval or {})
    log.info("held-out (%d tasks): %s", len(run.suite.eval_tasks),
             ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if "/success/" not in k))
    return metrics


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        metrics = evaluate(cfg)
    except ConfigError as err:
        log.error("invalid configuration: %s", err)
        raise SystemExit(2) from None
    return metrics.get(cfg.objective)


if __name__ == "__main__":
    main()
