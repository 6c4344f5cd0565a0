"""RolloutDataModule: the tasks of each RL iteration, and the held-out set for validation.

Data is not a fixed dataset here: every iteration plays new tasks with the *current* policy, so the loaders are
one-item iterables that hand over the tasks when Lightning asks for the batch, and the iteration itself
(``progpo.algo.iteration``) collects the rollouts. The DataModule counts the iterations it has handed out and
keeps that count in the checkpoint, so a resumed run plays exactly the tasks an uninterrupted one would.

On several ranks every rank draws the same tasks and keeps its contiguous share (``progpo.dist.shard``): all N
rollouts of a task are played on one rank. The held-out set is shared out the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from envs.base import EnvSuite, Task
from progpo import dist
from progpo.algo.iteration import IterationTasks


class TasksBatch:
    """The DataLoader's item: an ``IterationTasks`` behind a plain object, unwrapped by
    ``ProGPOModule.transfer_batch_to_device``. Lightning hands each batch to its precision plugin's ``convert_input``
    before any module hook, and FSDP's plugin walks it with ``apply_to_collection``, which refuses frozen dataclasses
    (``IterationTasks``, ``Task``) but passes a plain object through."""

    __slots__ = ("tasks",)

    def __init__(self, tasks: IterationTasks) -> None:
        self.tasks = tasks


class _OnDemand(IterableDataset):
    """An iterable of exactly one item, produced when iterated (so it sees the latest state)."""

    def __init__(self, produce: Callable[[], IterationTasks]) -> None:
        self.produce = produce

    def __iter__(self) -> Iterator[TasksBatch]:
        yield TasksBatch(self.produce())


def sample_tasks(tasks: list[Task], n: int, seed: int, iteration: int) -> list[Task]:
    """Tasks of one iteration: a function of (seed, iteration) only, so a resumed run samples the same tasks."""
    if not tasks:
        raise ValueError("the environment has no training tasks; check env.n_train / env.data_dir")
    rng = np.random.default_rng([seed, iteration])
    replace = n > len(tasks)
    idx = rng.choice(len(tasks), size=n, replace=replace)
    return [tasks[i] for i in idx]


class RolloutDataModule(L.LightningDataModule):
    """``tasks_per_batch`` training tasks per iteration (index = iterations handed out so far), all held-out
    tasks for validation; on several ranks, this rank's share of each."""

    def __init__(self, suite: EnvSuite, tasks_per_batch: int, seed: int) -> None:
        super().__init__()
        self.suite = suite
        self.tasks_per_batch = tasks_per_batch
        self.seed = seed
        self.iterations_done = 0

    def train_batch(self) -> IterationTasks:
        index = self.iterations_done
        tasks = sample_tasks(self.suite.train_tasks, self.tasks_per_batch, self.seed, index)
        self.iterations_done += 1
        return _rank_share(index, tasks)

    def eval_batch(self) -> IterationTasks:
        return _rank_share(self.iterations_done, list(self.suite.eval_tasks))

    def train_dataloader(self) -> DataLoader:
        return _loader(self.train_batch)

    def val_dataloader(self) -> DataLoader:
        return _loader(self.eval_batch)

    def state_dict(self) -> dict[str, Any]:
        return {"iterations_done": self.iterations_done}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations_done = int(state_dict["iterations_done"])


def _rank_share(iterations_done: int, tasks: list[Task]) -> IterationTasks:
    """This rank's contiguous share of ``tasks`` (all of them in one process), with its first task's index."""
    start, stop = dist.shard(len(tasks))
    return IterationTasks(iterations_done=iterations_done, tasks=tasks[start:stop], first_group=start)


def _loader(produce: Callable[[], IterationTasks]) -> DataLoader:
    # Its own generator: every iterator a DataLoader starts draws a seed from it, and drawing from torch's global
    # RNG instead would shift the sampling stream by however many times Lightning starts one (differently on a
    # resumed run than on an uninterrupted one).
    return DataLoader(_OnDemand(produce), batch_size=None, num_workers=0, collate_fn=_identity,
                      generator=torch.Generator())


def _identity(x):
    return x
