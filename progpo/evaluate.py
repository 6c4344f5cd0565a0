"""`python -m progpo.evaluate`: held-out success of the configured model as it is (zero-shot for a pretrained
model, the warm start for ``tiny``) or of an RL checkpoint (``ckpt_path``), with no training. Takes the same overrides
as ``progpo.train``; the metrics go to the logger and ``<run_dir>/metrics.jsonl`` like a training run's step-0
evaluation.

    python -m progpo.evaluate model=smollm2-135m env.n_eval=16 eval.temperature=0.4 logger=none
    python -m progpo.evaluate <the run's overrides> ckpt_path=outputs/runs/<run>/checkpoints/last.ckpt \
        run_name=<run>-eval-t0.4 eval.temperature=0.4

With ``ckpt_path`` the checkpoint's weights are evaluated in a run of their own (a new logger run, nothing resumed);
``run_name`` must give it a folder other than the checkpoint's, so the training run's config and metrics stay as
they were.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, open_dict

from progpo.config import ConfigError
from progpo.runs import existing_ckpt_path, load_run_weights, read_checkpoint, resolve_run_dir
from progpo.train import build

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig, callbacks: list | None = None) -> dict[str, float]:
    """One held-out evaluation of the model as built, or of the RL checkpoint ``cfg.ckpt_path``; returns its
    ``val/*`` metrics. ``callbacks``: extra Lightning callbacks (as ``progpo.train.build`` takes them)."""
    checkpoint = _checkpoint_to_evaluate(cfg)
    run = build(cfg, callbacks)
    try:
        if checkpoint is not None:
            load_run_weights(run, checkpoint)
            log.info("evaluating the weights of %s", checkpoint)
        run.trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    finally:
        run.collector.close()
        run.engine.close()
    metrics = dict(run.record.last_eval or {})
    log.info("held-out (%d tasks): %s", len(run.suite.eval_tasks),
             ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items()) if "/success/" not in k))
    return metrics


def _checkpoint_to_evaluate(cfg: DictConfig) -> Path | None:
    """Take ``ckpt_path`` out of ``cfg`` (``build`` would resume from it: the training run's logger run and config)
    after checking it is a readable checkpoint outside the evaluation's own folder. ``resume=true`` is refused: it
    would continue the training run's logger run with weights that are not its checkpoint's."""
    if cfg.get("resume"):
        raise ConfigError("resume=true: progpo.evaluate resumes nothing; give the weights to evaluate as "
                          "ckpt_path=outputs/runs/<run>/checkpoints/last.ckpt with a run_name of its own")
    if not cfg.get("ckpt_path"):
        return None
    checkpoint = existing_ckpt_path(cfg.ckpt_path)
    read_checkpoint(checkpoint)  # an empty or corrupt file fails here, naming it, before anything is built
    own_run = checkpoint.resolve().parent.parent
    if resolve_run_dir(cfg).resolve() == own_run:
        raise ConfigError(
            f"ckpt_path={checkpoint} is in this evaluation's own folder {own_run}: the evaluation would replace the "
            f"training run's config and add to its metrics. Give it a folder of its own, e.g. "
            f"run_name={own_run.name}-eval"
        )
    with open_dict(cfg):
        cfg.ckpt_path = None
    return checkpoint


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
