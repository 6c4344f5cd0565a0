"""RolloutDataModule: task sampling per iteration and how the held-out set is evaluated."""

from __future__ import annotations

import pytest
import torch

from envs.base import Task
from progpo.rollout.datamodule import RolloutDataModule, sample_tasks


class RecordingCollector:
    """Records how it is called and draws from torch's RNG the way sampled generation does."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def collect(self, tasks, group_size, greedy=False, progress=None, temperature=None):
        draw = torch.rand(3)
        self.calls.append(dict(n=len(tasks), group_size=group_size, greedy=greedy, temperature=temperature,
                               draw=draw))
        return draw


class Suite:
    train_tasks = [Task(task_id=f"t{i}", task_type="a") for i in range(10)]
    eval_tasks = train_tasks[:4]


def test_sampled_evaluation_is_seeded_and_leaves_the_training_rng_alone():
    collector = RecordingCollector()
    dm = RolloutDataModule(collector, Suite(), 2, 3, seed=7, eval_temperature=0.4)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, second = dm.eval_batch(), dm.eval_batch()
    assert torch.equal(first, second)  # every evaluation draws the same numbers: start vs end like for like
    assert torch.equal(torch.get_rng_state(), before)  # evaluation does not shift the training stream
    call = collector.calls[0]
    assert (call["n"], call["group_size"], call["greedy"], call["temperature"]) == (4, 1, False, 0.4)
    other_seed = RolloutDataModule(RecordingCollector(), Suite(), 2, 3, seed=8, eval_temperature=0.4).eval_batch()
    assert not torch.equal(first, other_seed)


def test_zero_eval_temperature_is_greedy_and_negative_is_rejected():
    collector = RecordingCollector()
    RolloutDataModule(collector, Suite(), 2, 3, seed=0, eval_temperature=0.0).eval_batch()
    assert collector.calls[0]["greedy"] is True and collector.calls[0]["temperature"] is None
    with pytest.raises(ValueError, match="eval_temperature"):
        RolloutDataModule(collector, Suite(), 2, 3, seed=0, eval_temperature=-0.1)


def test_train_tasks_depend_on_seed_and_iteration_only():
    tasks = Suite.train_tasks
    assert sample_tasks(tasks, 4, 0, 3) == sample_tasks(tasks, 4, 0, 3)
    assert sample_tasks(tasks, 4, 0, 3) != sample_tasks(tasks, 4, 0, 4)
    assert len(sample_tasks(tasks, 12, 0, 0)) == 12  # more than available: drawn with replacement
    with pytest.raises(ValueError, match="no training tasks"):
        sample_tasks([], 1, 0, 0)
