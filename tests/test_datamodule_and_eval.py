"""Task sampling per iteration (RolloutDataModule) and how the held-out set is evaluated (RLIteration.evaluate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envs.base import Task
from progpo.algo.iteration import IterationTasks, RLIteration
from progpo.config import PPOConfig
from progpo.lit.datamodule import RolloutDataModule, sample_tasks
from progpo.types import RolloutBatch

CONF = str(Path(__file__).resolve().parents[1] / "conf")


class RecordingCollector:
    """Records how it is called and draws from torch's RNG the way sampled generation does."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def collect(self, tasks, group_size, greedy=False, temperature=None, first_group=0):
        draw = torch.rand(3)
        self.calls.append(dict(n=len(tasks), group_size=group_size, greedy=greedy, temperature=temperature,
                               draw=draw))
        return RolloutBatch(turns=[], episodes=[], rollout_seconds=float(draw.sum()), generated_tokens=0,
                            env_steps=0)


class Suite:
    train_tasks = [Task(task_id=f"t{i}", task_type="a") for i in range(10)]
    eval_tasks = train_tasks[:4]


def _evaluator(collector, seed: int, temperature: float, episodes_per_task: int = 1) -> RLIteration:
    return RLIteration(collector, engine=None, credit=None, actor=None, reference=None,
                       ppo=PPOConfig(micro_batch_size=32),
                       pad_token_id=0, group_size=3, eval_temperature=temperature, seed=seed,
                       eval_episodes_per_task=episodes_per_task)


def test_sampled_evaluation_is_seeded_and_leaves_the_training_rng_alone():
    collector = RecordingCollector()
    rl = _evaluator(collector, seed=7, temperature=0.4)
    held_out = RolloutDataModule(Suite(), 2, seed=7).eval_batch()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, second = rl.evaluate(held_out), rl.evaluate(held_out)
    # every evaluation draws the same numbers: start vs end like for like
    assert torch.equal(collector.calls[0]["draw"], collector.calls[1]["draw"])
    assert first.metrics["perf/val_rollout_s"] == second.metrics["perf/val_rollout_s"]
    assert torch.equal(torch.get_rng_state(), before)  # evaluation does not shift the training stream
    call = collector.calls[0]
    assert (call["n"], call["group_size"], call["greedy"], call["temperature"]) == (4, 1, False, 0.4)
    other = RecordingCollector()
    _evaluator(other, seed=8, temperature=0.4).evaluate(held_out)
    assert not torch.equal(collector.calls[0]["draw"], other.calls[0]["draw"])


def test_zero_eval_temperature_is_greedy():
    collector = RecordingCollector()
    _evaluator(collector, seed=0, temperature=0.0).evaluate(IterationTasks(0, Suite.eval_tasks))
    assert collector.calls[0]["greedy"] is True and collector.calls[0]["temperature"] is None


def test_several_episodes_per_held_out_task_are_one_group_each():
    collector = RecordingCollector()
    _evaluator(collector, seed=0, temperature=1.0, episodes_per_task=3).evaluate(IterationTasks(0, Suite.eval_tasks))
    assert (collector.calls[0]["n"], collector.calls[0]["group_size"]) == (4, 3)


@pytest.mark.slow
def test_held_out_metrics_are_over_every_episode_of_every_task(tmp_path):
    """The real collector and env (experiment=fast_dev): k episodes per held-out task, the metrics over all."""
    from hydra import compose, initialize_config_dir

    from progpo.train import build
    from progpo.types import episode_metrics

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "experiment=fast_dev", "logger=none", f"run_dir={tmp_path / 'run'}", "eval.temperature=1.0",
            "eval.episodes_per_task=3"])
    run = build(cfg)
    try:
        result = run.module.rl.evaluate(run.datamodule.eval_batch())
    finally:
        run.collector.close()
        run.engine.close()
    episodes = result.batch.episodes
    held_out = [t.task_id for t in run.suite.eval_tasks]
    assert sorted(e.task.task_id for e in episodes) == sorted(held_out * 3)
    assert result.metrics["val/success"] == pytest.approx(sum(e.won for e in episodes) / len(episodes))
    assert result.metrics["val/episode_length"] == episode_metrics(episodes, "val")["val/episode_length"]
    # the k episodes of a task are sampled apart: some task's trajectories differ in their actions
    actions = {traj: tuple(t.action for t in result.batch.turns if t.traj == traj) for traj in {e.traj for e in episodes}}
    by_task = [{actions[e.traj] for e in episodes if e.task.task_id == task} for task in held_out]
    assert any(len(distinct) > 1 for distinct in by_task), "every task's 3 sampled episodes were alike"


def test_train_tasks_depend_on_seed_and_iteration_only():
    tasks = Suite.train_tasks
    assert sample_tasks(tasks, 4, 0, 3) == sample_tasks(tasks, 4, 0, 3)
    assert sample_tasks(tasks, 4, 0, 3) != sample_tasks(tasks, 4, 0, 4)
    assert len(sample_tasks(tasks, 12, 0, 0)) == 12  # more than available: drawn with replacement
    with pytest.raises(ValueError, match="no training tasks"):
        sample_tasks([], 1, 0, 0)


def test_the_datamodule_counts_iterations_and_a_restored_one_continues_the_task_stream():
    straight = RolloutDataModule(Suite(), 3, seed=5)
    stream = [straight.train_batch() for _ in range(4)]
    assert [b.iterations_done for b in stream] == [0, 1, 2, 3]
    assert all(b.tasks == sample_tasks(Suite.train_tasks, 3, 5, i) for i, b in enumerate(stream))
    assert straight.eval_batch().iterations_done == 4 and straight.eval_batch().tasks == Suite.eval_tasks
    # a checkpoint written after iteration 2 (two batches handed out) resumes at iteration index 2
    interrupted = RolloutDataModule(Suite(), 3, seed=5)
    interrupted.train_batch(), interrupted.train_batch()
    resumed = RolloutDataModule(Suite(), 3, seed=5)
    resumed.load_state_dict(interrupted.state_dict())
    assert [resumed.train_batch().tasks for _ in range(2)] == [b.tasks for b in stream[2:]]


def test_a_loader_item_passes_lightnings_batch_walk_and_unwraps_to_the_tasks():
    """Lightning's precision plugins (FSDP's among them) walk every batch with ``apply_to_collection`` before any
    module hook; it refuses frozen dataclasses, so the DataLoader's item must get through it unchanged."""
    from lightning.fabric.utilities.apply_func import apply_to_collection

    from progpo.lit.module import ProGPOModule

    item = next(iter(RolloutDataModule(Suite(), 3, seed=5).train_dataloader()))
    walked = apply_to_collection(item, torch.Tensor, lambda t: t.to(torch.float16))
    with pytest.raises(ValueError, match="frozen dataclass"):  # what the wrapper protects against
        apply_to_collection(walked.tasks, torch.Tensor, lambda t: t)
    tasks = ProGPOModule.transfer_batch_to_device(None, walked, torch.device("cpu"), 0)
    assert isinstance(tasks, IterationTasks) and tasks.tasks == sample_tasks(Suite.train_tasks, 3, 5, 0)
