"""ProGPOModule: the actor under Lightning; one training step is one RL iteration (``progpo.algo.iteration``).

Lightning supplies the loop, the device and precision handling, the optimizer and its backward (manual
optimisation: PPO takes several optimizer steps per batch); the iteration does the RL. The step returns the
typed result as its outputs (``{"result": IterationResult}``), which callbacks receive; nothing else is kept on
the module between steps. The reference policy is not a registered submodule: it is rebuilt from the model
config on resume, so checkpoints hold the actor and optimizer only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch

from progpo.algo.iteration import IterationTasks, RLIteration


class ProGPOModule(L.LightningModule):
    """Args: ``rl``, the iteration (it holds the actor); ``optimizer``, a factory taking ``params=``
    (``conf/optim/*.yaml`` with ``_partial_: true``)."""

    def __init__(self, rl: RLIteration, optimizer: Callable[..., torch.optim.Optimizer]) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.actor = rl.actor
        self.rl = rl
        self.optimizer_factory = optimizer

    def configure_optimizers(self):
        return self.optimizer_factory(params=[p for p in self.actor.parameters() if p.requires_grad])

    def on_fit_start(self) -> None:
        self.actor.train()
        if self.trainer.ckpt_path:  # the actor's weights were just restored: the engine must sample from them
            self.rl.engine.sync_weights(self.actor)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # tasks, not tensors; tensors are built on the right device in the iteration

    def training_step(self, batch: IterationTasks, batch_idx: int) -> dict[str, Any]:
        result = self.rl.run(batch, self.optimizers(), self.manual_backward)
        self._log(result.metrics, step=result.iteration)
        return {"result": result}

    def validation_step(self, batch: IterationTasks, batch_idx: int) -> dict[str, Any]:
        result = self.rl.evaluate(batch)
        self._log(result.metrics, step=result.iteration)
        return {"result": result}

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """To the logger at step = iteration (Lightning's own step counts optimizer steps), and to
        ``trainer.callback_metrics`` for callbacks that monitor a key (pruning, checkpoint selection)."""
        clean = finite(metrics)
        if self.logger is not None:
            self.logger.log_metrics(clean, step=step)
        self.log_dict(clean, logger=False, on_epoch=True, batch_size=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        rng = checkpoint.get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            if rng.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics as floats, without the non-finite ones (MLflow rejects NaN)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
