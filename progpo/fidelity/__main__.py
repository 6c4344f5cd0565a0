"""`python -m progpo.fidelity [overrides]`: how right is each estimator's credit on the configured policy's batch.

    python -m progpo.fidelity experiment=laptop_alfworld
    python -m progpo.fidelity experiment=laptop_alfworld ckpt_path=outputs/runs/<run>/checkpoints/last.ckpt
    python -m progpo.fidelity fidelity.truth=outputs/fidelity/<run>/truth.npz fidelity.estimators=[progpo,hgpo]

Takes every override of ``progpo.train`` plus ``fidelity.*`` (``conf/fidelity.yaml``). Results land in
``outputs/fidelity/<run>/`` (``fidelity.md``, CSVs, figures, ``truth.npz``) and in an MLflow run tagged
``progpo.kind=fidelity``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from progpo.config import ConfigError
from progpo.fidelity.measure import measure
from progpo.tracking.mlflow_logger import KIND_TAG

log = logging.getLogger(__name__)


def fidelity_run_name(run_name: str | None, env: str, model: str, seed: int, ckpt_path: str | None) -> str:
    """``run_name``, else ``fidelity-<env>-<model>-seed<seed>``, with ``-<run>-<checkpoint>`` for a checkpoint."""
    if run_name:
        return str(run_name)
    name = f"fidelity-{env}-{model}-seed{seed}"
    if ckpt_path:
        path = Path(str(ckpt_path))
        name += f"-{path.parent.parent.name}-{path.stem}"
    return name


OmegaConf.register_new_resolver("progpo.fidelity_name", fidelity_run_name, replace=True)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="fidelity")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from hydra.core.hydra_config import HydraConfig

    with open_dict(cfg):
        cfg.run_name = Path(HydraConfig.get().runtime.output_dir).name
        if "tags" in cfg.logger:
            cfg.logger.tags = {**OmegaConf.to_container(cfg.logger.tags), KIND_TAG: "fidelity"}
    try:
        result = measure(cfg)
    except ConfigError as err:
        log.error("invalid configuration: %s", err)
        raise SystemExit(2) from None
    best = max(result.scores.values, key=lambda name: result.scores.values[name]["spearman"].value)
    log.info("highest Spearman with the Monte-Carlo advantage: %s (%s)", best,
             result.scores.values[best]["spearman"])
    return result.scores.values[best]["spearman"].value


if __name__ == "__main__":
    main()
