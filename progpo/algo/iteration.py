"""One RL iteration, top to bottom: collect -> score -> credit -> reference -> update -> push weights -> metrics.

This is the file to read to know what training does. ``RLIteration.run`` takes the tasks of one iteration (the
DataModule samples them from (seed, iteration) only) and returns a typed :class:`IterationResult`; Lightning
(``progpo.lit``) only supplies the optimizer, the backward and the loop around it, and callbacks receive the
result as the step's outputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from progpo import dist
from progpo.algo.credit import batch_credit
from progpo.algo.metrics import batch_episode_metrics, iteration_metrics, sampler_mismatch
from progpo.algo.ppo import ppo_update, updated_steps
from progpo.algo.scoring import ScoredTurns, reference_logprobs, score_turns
from progpo.config import PPOConfig
from progpo.credit import CreditResult, StepBatch
from progpo.types import RolloutBatch, Turn


@dataclass(frozen=True)
class IterationTasks:
    """What the DataModule yields: the tasks to play, and how many iterations are done before this batch.

    On several ranks ``tasks`` is this rank's contiguous share of the iteration's tasks and ``first_group`` the
    index of its first task among all of them: group and trajectory ids are global, so a step has the same ids
    on any number of ranks.
    """

    iterations_done: int
    tasks: list[Any]  # envs.base.Task
    first_group: int = 0


@dataclass
class IterationResult:
    """One training iteration's outcome; ``iteration`` counts iterations done including this one."""

    iteration: int
    metrics: dict[str, float]
    batch: RolloutBatch
    credit: CreditResult


@dataclass
class EvalResult:
    """One held-out evaluation; ``iteration`` is the number of iterations done when it ran."""

    iteration: int
    metrics: dict[str, float]
    batch: RolloutBatch


def step_batch(turns: list[Turn], embeddings: torch.Tensor | None) -> StepBatch:
    """The credit estimators' view of a batch (``docs/guide/credit.md``, "Input")."""
    return StepBatch(
        group=torch.tensor([t.group for t in turns], dtype=torch.long),
        traj=torch.tensor([t.traj for t in turns], dtype=torch.long),
        t=torch.tensor([t.t for t in turns], dtype=torch.long),
        obs=torch.tensor([t.obs_id for t in turns], dtype=torch.long),
        reward=torch.tensor([t.reward for t in turns], dtype=torch.float64),
        embedding=embeddings.detach().to("cpu", torch.float32) if embeddings is not None else None,
    )


class RLIteration:
    """Everything one iteration touches, and the iteration itself.

    Args:
        collector: plays tasks with the engine (``progpo.rollout.collector.RolloutCollector``).
        engine: the generation backend the collector drives; it receives the actor's weights after every update.
        credit: the credit estimator (``StepBatch -> CreditResult``), a Hydra component.
        actor: the trained policy model.
        reference: the frozen KL anchor, or None (``ppo.kl_coef = 0``).
        ppo: the update's settings, ``micro_batch_size`` resolved to an int (``progpo.train`` resolves ``auto``).
        pad_token_id: padding id of the scoring and update batches.
        group_size: rollouts per task (N).
        eval_temperature: held-out sampling temperature; 0 = greedy.
        eval_episodes_per_task: held-out episodes per task (sampled; the metrics are over all of them).
        seed: the run's seed (minibatch order, held-out sampling stream).
    """

    def __init__(self, collector, engine, credit, actor: torch.nn.Module, reference: torch.nn.Module | None,
                 ppo: PPOConfig, pad_token_id: int, group_size: int, eval_temperature: float, seed: int,
                 eval_episodes_per_task: int = 1) -> None:
        if ppo.micro_batch_size == "auto":
            raise ValueError("ppo.micro_batch_size=auto must be resolved before the iteration is built: "
                             "progpo.hardware.auto_batch_rows(precision, uses_cuda) gives the int (progpo.train does it)")
        self.collector = collector
        self.engine = engine
        self.credit = credit
        self.actor = actor
        self.reference = reference
        self.ppo = ppo
        self.pad_token_id = pad_token_id
        self.group_size = group_size
        self.eval_temperature = float(eval_temperature)
        self.eval_episodes_per_task = int(eval_episodes_per_task)
        self.seed = seed

    def run(self, tasks: IterationTasks, optimizer, backward,
            no_sync: Callable[[], AbstractContextManager] = nullcontext) -> IterationResult:
        """One iteration; ``optimizer``, ``backward`` and ``no_sync`` come from the trainer (Lightning's manual
        optimisation; ``no_sync`` defers the strategy's gradient reduction, see ``ppo_update``).

        On several ranks each plays its share of the tasks; credit, metrics and the update are those of the whole
        batch (``progpo.dist``); the returned ``batch`` and ``credit`` hold this rank's steps.
        """
        # 1. Collect: B tasks x N rollouts with the weights the engine holds (synced at the end of the last one).
        batch = self.collector.collect(tasks.tasks, self.group_size, first_group=tasks.first_group)
        return self.learn(batch, tasks.iterations_done, optimizer, backward, no_sync)

    def learn(self, batch: RolloutBatch, iterations_done: int, optimizer, backward,
              no_sync: Callable[[], AbstractContextManager] = nullcontext) -> IterationResult:
        """Steps 2-6 of ``run`` on a collected batch: score, credit, reference, update, weight sync, metrics
        (``perf/<phase>_s`` time each phase). Apart from ``run`` so that ``progpo.bench iteration`` times the very
        same phases on a rollout it also scores the old way."""
        # 2. Score with the same weights: old log-probs and state embeddings (reused from the HF engine's sampling
        #    unless ppo.recompute_old_logprobs).
        started = time.perf_counter()
        scored, steps = self.score(batch)
        score_s = time.perf_counter() - started
        # 3. Credit: one advantage per step, computed over the steps of all ranks.
        started = time.perf_counter()
        credit = batch_credit(self.credit, steps)
        credit_s = time.perf_counter() - started
        advantages = credit.advantage.to(torch.float32)
        # 3b. Reference log-probs, for the KL of the steps the update trains on only.
        if self.reference is not None:
            started = time.perf_counter()
            trained = updated_steps(batch.turns, advantages, self.ppo.skip_zero_advantage)
            scored = replace(scored, ref_logprobs=reference_logprobs(
                self.reference, batch.turns, trained, self.pad_token_id, self.ppo.micro_batch_size,
                scored.representative))
            score_s += time.perf_counter() - started
        # 4. Update: PPO epochs of clipped-surrogate minibatches.
        started = time.perf_counter()
        update = ppo_update(self.actor, optimizer, backward, batch.turns, scored, advantages, self.ppo,
                            self.pad_token_id, seed=self.seed, iteration=iterations_done, no_sync=no_sync)
        update_s = time.perf_counter() - started
        # 5. Push the new weights to the engine, so the next collection samples from them (no-op for HF).
        started = time.perf_counter()
        self.engine.sync_weights(self.actor)
        sync_s = time.perf_counter() - started
        # 6. Metrics.
        metrics = iteration_metrics(
            batch, credit, advantages, update, sampler_mismatch(batch.turns, scored.old_logprobs),
            {"score": score_s, "credit": credit_s, "update": update_s, "sync": sync_s},
        )
        return IterationResult(iterations_done + 1, metrics, batch, credit)

    def score(self, batch: RolloutBatch) -> tuple[ScoredTurns, StepBatch]:
        """Old log-probs and state embeddings of ``batch`` with the current weights, and the credit estimators' view
        of it (``StepBatch``): what every estimator sees in training (``progpo.fidelity`` scores them on it)."""
        scored = score_turns(self.actor, None, batch.turns, self.pad_token_id, self.ppo.micro_batch_size,
                             recompute_old=self.ppo.recompute_old_logprobs)
        return scored, step_batch(batch.turns, scored.embeddings)

    def evaluate(self, tasks: IterationTasks) -> EvalResult:
        """``eval_episodes_per_task`` episodes per held-out task (one when greedy, ``eval_temperature=0``), sampled
        at that temperature.

        On several ranks each plays its share of the held-out tasks and the metrics are over all of them.
        Sampling uses its own seeded RNG stream, so every evaluation of a run draws the same random numbers
        (start and end are compared like for like) and evaluating never shifts the training stream.
        """
        greedy = self.eval_temperature == 0
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            batch = self.collector.collect(tasks.tasks, self.eval_episodes_per_task, greedy=greedy,
                                           temperature=None if greedy else self.eval_temperature,
                                           first_group=tasks.first_group)
        slowest = dist.max_over_ranks({"rollout": batch.rollout_seconds})["rollout"]
        metrics = {**batch_episode_metrics(batch, "val"), "perf/val_rollout_s": slowest}
        return EvalResult(tasks.iterations_done, metrics, batch)
