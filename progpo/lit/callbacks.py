"""Lightning callbacks of the RL loop. Each reads the step outputs (``{"result": IterationResult}`` from
training, ``{"result": EvalResult}`` from validation), never the module's attributes.

- ``RunRecord``: every logged row, the start and latest held-out evaluation, ``metrics.jsonl``; in the checkpoint.
- ``IterationProgressBar``: one tick per iteration with the latest train and held-out success.
- ``IterationCheckpoint``: ``last.ckpt`` after every iteration, ``iter-XXXX.ckpt`` every N (both atomic, through
  ``AtomicCheckpointIO``).
- ``TrajectoryTable``: sampled turns with their credit to the logger every N iterations.

On several ranks every callback runs on every rank (checkpoint hooks must); files, the progress bar and the logger
are rank 0's (the other ranks have no logger).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from progpo.lit.module import finite
from progpo.progress import Bar, progress_bar

log = logging.getLogger(__name__)


def _result(outputs: Any):
    return outputs["result"] if isinstance(outputs, dict) and "result" in outputs else None


class RunRecord(L.Callback):
    """The run's record: every logged row (``history``, also appended to ``metrics.jsonl``), the first and the
    latest held-out evaluation, and the logger's run id. Saved in the checkpoint under ``progpo``, so a resumed
    run continues the same record (rows of an interrupted iteration are dropped and logged again)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.history: list[dict[str, float]] = []
        self.initial_eval: dict[str, float] | None = None
        self.last_eval: dict[str, float] | None = None
        self.last_eval_iteration = -1
        self.iterations_done = 0
        self.logger_run_id: str | None = None
        self.logged_here = 0  # rows this process logged (a resumed run's history starts with the checkpoint's)

    def _append(self, trainer, step: int, metrics: dict[str, float]) -> None:
        row = {"step": float(step), **finite(metrics)}
        self.history.append(row)
        self.logged_here += 1
        if trainer.is_global_zero:  # every rank keeps the record (the metrics are over all ranks); rank 0 writes
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    def on_fit_start(self, trainer, pl_module) -> None:
        # Rewrite from the (possibly checkpoint-restored) history: rows of an iteration that was interrupted
        # before its checkpoint are dropped here and logged again when the iteration is re-run.
        if trainer.is_global_zero:
            self.path.write_text("".join(json.dumps(row) + "\n" for row in self.history))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        result = _result(outputs)
        if result is not None:
            self.iterations_done = result.iteration
            self._append(trainer, result.iteration, result.metrics)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        result = _result(outputs)
        if result is None:
            return
        if self.initial_eval is None:
            self.initial_eval = dict(result.metrics)
        self.last_eval = dict(result.metrics)
        self.last_eval_iteration = result.iteration
        self._append(trainer, result.iteration, result.metrics)

    def rows_this_process(self) -> list[dict[str, float]]:
        """The rows this process logged, not those a resumed run restored from its checkpoint."""
        return self.history[len(self.history) - self.logged_here:]

    def final_metrics(self) -> dict[str, float]:
        """Last value of every metric, plus the start-of-run evaluation under ``start/``."""
        out: dict[str, float] = {}
        for row in self.history:
            out.update({k: v for k, v in row.items() if k != "step"})
        for key, value in (self.initial_eval or {}).items():
            out[key.replace("val/", "start/", 1)] = value
        out["iterations"] = float(self.iterations_done)
        return out

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["progpo"] = {
            "iterations_done": self.iterations_done,
            "initial_eval": self.initial_eval,
            "last_eval": self.last_eval,
            "last_eval_iteration": self.last_eval_iteration,
            "history": self.history,
            "logger_run_id": getattr(trainer.logger, "run_id", None) if trainer.logger else None,
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        state = checkpoint.get("progpo", {})
        self.iterations_done = state.get("iterations_done", 0)
        self.initial_eval = state.get("initial_eval")
        self.last_eval = state.get("last_eval")
        self.last_eval_iteration = state.get("last_eval_iteration", -1)
        self.history = list(state.get("history", []))
        self.logger_run_id = state.get("logger_run_id")


class IterationProgressBar(L.Callback):
    """One tick per RL iteration, showing the latest train and held-out success."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Bar | None = None
        self.postfix: dict[str, str] = {}

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        done = trainer.datamodule.iterations_done if trainer.datamodule is not None else 0
        self.bar = progress_bar(total=self.total, initial=done, desc="RL iterations", unit="it", dynamic_ncols=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        result = _result(outputs)
        if self.bar is None or result is None:
            return
        for key, short in (("train/success", "train"), ("loss/kl", "kl"), ("perf/rollout_s", "roll_s"),
                           ("perf/update_s", "upd_s")):
            if key in result.metrics:
                self.postfix[short] = f"{result.metrics[key]:.3g}"
        self.bar.set_postfix(self.postfix)
        self.bar.update(1)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        result = _result(outputs)
        if result is not None and "val/success" in result.metrics:
            self.postfix["val"] = f"{result.metrics['val/success']:.3f}"
            if self.bar is not None:
                self.bar.set_postfix(self.postfix)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to ``<name>.tmp`` beside the target, flushed to disk, then renamed over it.

    A crash or SIGKILL mid-write leaves the previous checkpoint intact and no file outside the checkpoint folder
    (Lightning's own atomic save stages the file in the system temp directory, where a killed write stays).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as fh:
            torch.save(checkpoint, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


class IterationCheckpoint(L.Callback):
    """``last.ckpt`` after every iteration, ``iter-XXXX.ckpt`` every ``every`` iterations, and the checkpoint's
    location as a logger tag. A crash or SIGKILL mid-iteration therefore loses at most the iteration in progress;
    writes are atomic (``AtomicCheckpointIO``), and a write killed half-way is cleaned up at the next start."""

    def __init__(self, dirpath: Path, every: int) -> None:
        self.dirpath = Path(dirpath)
        self.every = every
        self.iteration = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        for stale in self.dirpath.glob("*.ckpt.tmp"):
            stale.unlink()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        result = _result(outputs)
        if result is not None:
            self.iteration = result.iteration

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from progpo.tracking import log_checkpoint

        last = self.dirpath / "last.ckpt"
        trainer.save_checkpoint(str(last), weights_only=False)  # on every rank; rank 0 writes the file
        if self.iteration % self.every == 0:
            periodic = self.dirpath / f"iter-{self.iteration:04d}.ckpt"
            trainer.save_checkpoint(str(periodic), weights_only=False)
            log.info("checkpoint %s", periodic)
        if trainer.logger is not None:
            log_checkpoint(trainer.logger, last, self.iteration)


class TrajectoryTable(L.Callback):
    """Every ``every`` iterations, the turns of the first ``max_groups`` task groups go to the logger as a table
    (prompt, response, action, valid, reward, return, advantage and its parts)."""

    def __init__(self, every: int, tokenizer, max_groups: int = 2) -> None:
        self.every = every
        self.tokenizer = tokenizer
        self.max_groups = max_groups

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from progpo.tracking import log_trajectories

        result = _result(outputs)
        if trainer.logger is None or result is None or not self.every or result.iteration % self.every:
            return
        log_trajectories(trainer.logger, trajectory_rows(result, self.tokenizer, self.max_groups), result.iteration)


def trajectory_rows(result, tokenizer, max_groups: int) -> list[dict]:
    """One row per turn of the first ``max_groups`` groups of an iteration, with its return and advantage."""
    batch, credit = result.batch, result.credit
    rows = []
    for i, turn in enumerate(batch.turns):
        if turn.group >= max_groups:
            continue
        row = {
            "group": turn.group, "traj": turn.traj, "t": turn.t,
            "prompt": tokenizer.decode(turn.prompt_ids),
            "response": turn.response_text, "action": turn.action, "valid": turn.valid,
            "reward": turn.reward, "return": float(credit.returns[i]), "advantage": float(credit.advantage[i]),
        }
        row.update({name: float(values[i]) for name, values in credit.parts.items()})
        rows.append(row)
    return sorted(rows, key=lambda r: (r["group"], r["traj"], r["t"]))
