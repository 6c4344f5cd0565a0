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

import hydra
from omegaconf import DictConfig

from progpo.config import ConfigError
from progpo.fidelity.measure import measure

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="fidelity")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
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
