"""Lightning callbacks of the RL loop: a per-iteration progress bar, checkpoints, a local metrics file."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import lightning as L
from tqdm.auto import tqdm

log = logging.getLogger(__name__)


class IterationProgressBar(L.Callback):
    """One tick per RL iteration, showing the latest train and held-out success."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: tqdm | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.bar = tqdm(total=self.total, initial=pl_module.iterations_done, desc="RL iterations",
                        unit="it", dynamic_ncols=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.bar is None:
            return
        last = pl_module.history[-1] if pl_module.history else {}
        postfix = {}
        for key, short in (("train/success", "train"), ("loss/kl", "kl"), ("perf/rollout_s", "roll_s"),
                           ("perf/update_s", "upd_s")):
            if key in last:
                postfix[short] = f"{last[key]:.3g}"
        if pl_module.last_eval:
            postfix["val"] = f"{pl_module.last_eval.get('val/success', float('nan')):.3f}"
        self.bar.set_postfix(postfix)
        self.bar.update(1)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class IterationCheckpoint(L.Callback):
    """``last.ckpt`` after every iteration (written atomically), ``iter-XXXX.ckpt`` every ``every`` iterations.

    A crash or SIGKILL mid-iteration therefore loses at most the iteration in progress.
    """

    def __init__(self, dirpath: Path, every: int) -> None:
        self.dirpath = Path(dirpath)
        self.every = every

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        tmp = self.dirpath / "last.ckpt.tmp"
        trainer.save_checkpoint(str(tmp), weights_only=False)
        os.replace(tmp, self.dirpath / "last.ckpt")
        iteration = pl_module.iterations_done
        if iteration % self.every == 0:
            periodic = self.dirpath / f"iter-{iteration:04d}.ckpt"
            trainer.save_checkpoint(str(periodic), weights_only=False)
            log.info("checkpoint %s", periodic)


class MetricsFile(L.Callback):
    """Every logged row also goes to ``metrics.jsonl`` in the run folder (plain, greppable, logger-independent)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._written = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        # Rewrite from the (possibly checkpoint-restored) history: rows of an iteration that was interrupted
        # before its checkpoint are dropped here and logged again when the iteration is re-run.
        self.path.write_text("".join(json.dumps(row) + "\n" for row in pl_module.history))
        self._written = len(pl_module.history)

    def _flush(self, pl_module) -> None:
        rows = pl_module.history[self._written :]
        if rows:
            with self.path.open("a") as fh:
                for row in rows:
                    fh.write(json.dumps(row) + "\n")
            self._written = len(pl_module.history)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._flush(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._flush(pl_module)


class TrajectoryTable(L.Callback):
    """Every ``every`` iterations, the turns of the first ``max_groups`` task groups go to the logger as a table
    (prompt, response, action, valid, reward, return, advantage and its parts), and the checkpoint path as a tag."""

    def __init__(self, every: int, max_groups: int = 2) -> None:
        self.every = every
        self.max_groups = max_groups

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from progpo.tracking import log_checkpoint, log_trajectories

        logger = trainer.logger
        iteration = pl_module.iterations_done
        if logger is None:
            return
        log_checkpoint(logger, Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt", iteration)
        if not self.every or iteration % self.every or pl_module.last_batch is None:
            return
        log_trajectories(logger, trajectory_rows(pl_module, self.max_groups), iteration)


def trajectory_rows(pl_module, max_groups: int) -> list[dict]:
    batch, credit = pl_module.last_batch, pl_module.last_credit
    rows = []
    for i, turn in enumerate(batch.turns):
        if turn.group >= max_groups:
            continue
        row = {
            "group": turn.group, "traj": turn.traj, "t": turn.t,
            "prompt": pl_module.tokenizer.decode(turn.prompt_ids),
            "response": turn.response_text, "action": turn.action, "valid": turn.valid,
            "reward": turn.reward, "return": float(credit.returns[i]), "advantage": float(credit.advantage[i]),
        }
        row.update({name: float(values[i]) for name, values in credit.parts.items()})
        rows.append(row)
    return sorted(rows, key=lambda r: (r["group"], r["traj"], r["t"]))
