"""ProGPOModule: the actor under Lightning; one training step is one RL iteration (``progpo.algo.iteration``).

Lightning supplies the loop, the device and precision handling, the optimizer and its backward (manual
optimisation: PPO takes several optimizer steps per batch); the iteration does the RL. The step returns the
typed result as its outputs (``{"result": IterationResult}``), which callbacks receive; nothing else is kept on
the module between steps. The reference policy is not a registered submodule: it is rebuilt from the model
config on resume, so checkpoints hold the actor and optimizer only.

Under a distributed strategy (DDP, FSDP) every rank runs the same step on its share of the tasks; the iteration
reduces what needs the whole batch. Checkpoints hold the world size that wrote them: a resumed run must use the
same one (its task shares, RNG streams and minibatch split depend on it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from progpo import dist
from progpo.algo.iteration import IterationTasks, RLIteration
from progpo.config import ConfigError, world_size_mismatch


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
        # Tasks, not tensors (tensors are built on the right device in the iteration): unwrap the DataModule's item.
        return batch.tasks

    def training_step(self, batch: IterationTasks, batch_idx: int) -> dict[str, Any]:
        result = self.rl.run(batch, self.optimizers(), self.manual_backward, self._no_sync)
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

    def _no_sync(self) -> AbstractContextManager:
        """A backward in this context does not reduce gradients across ranks: DDP's ``no_sync``. Other strategies
        (one process; FSDP, whose ``no_sync`` would keep whole unsharded gradients) reduce at every backward."""
        model = self.trainer.model
        return model.no_sync() if isinstance(model, DistributedDataParallel) else nullcontext()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Every rank's RNG states (every rank samples its own rollouts); Lightning calls this hook on all ranks.
        checkpoint["rng"] = dist.gather_objects([{
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }])
        checkpoint["world_size"] = dist.world_size()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = int(checkpoint.get("world_size", 1))
        if saved != dist.world_size():
            raise ConfigError(world_size_mismatch(saved, dist.world_size()))
        rng = checkpoint.get("rng")
        if isinstance(rng, list):  # one entry per rank
            rng = rng[dist.rank()]
        if rng:
            torch.set_rng_state(rng["torch"])
            if rng.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics as floats, without the non-finite ones (MLflow rejects NaN)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
