"""A chain with a known true advantage, for the fidelity tests (a test environment, named as such: not a benchmark).

The agent stands on cells 0..LENGTH; "forward" moves one cell on, "back" one cell back (not below 0), "wait" stays.
Reaching cell LENGTH wins (reward 10, the episode ends); an episode has at most ``max_steps`` steps. The policy is
fixed: ``ScriptedPolicy`` answers "forward", "wait", "back" with probabilities ``PROBS`` whatever the prompt, so
``Q(t, cell, a)`` and ``V(t, cell)`` follow by dynamic programming over (step, cell) and the true advantage of every
recorded step is known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from envs.base import SUCCESS_REWARD, EnvSuite, Observation, StepInfo, Task
from envs.pool import EnvPool
from progpo.rollout.collector import RolloutCollector
from progpo.rollout.engines.base import Generation

LENGTH = 4
MAX_STEPS = 8
ACTIONS = ("forward", "wait", "back")
PROBS = (0.45, 0.35, 0.20)


class ChainEnv:
    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps

    def reset(self, task: Task) -> Observation:
        self.cell, self.steps = 0, 0
        return self._obs()

    def _obs(self) -> Observation:
        return Observation(f"You are on cell {self.cell} of {LENGTH}.", ACTIONS, f"reach cell {LENGTH}", "chain")

    def step(self, action: str):
        self.steps += 1
        self.cell = next_cell(self.cell, action)
        won = self.cell == LENGTH
        done = won or self.steps >= self.max_steps
        return self._obs(), SUCCESS_REWARD if won else 0.0, done, StepInfo(won=won, valid=action in ACTIONS)

    def close(self) -> None:
        pass


def next_cell(cell: int, action: str) -> int:
    return min(cell + 1, LENGTH) if action == "forward" else max(cell - 1, 0) if action == "back" else cell


def chain_suite(n_tasks: int = 4) -> EnvSuite:
    tasks = [Task(task_id=f"chain-{i}", task_type="chain") for i in range(n_tasks)]
    return EnvSuite(name="chain", env_factory=ChainEnv, train_tasks=tasks, eval_tasks=tasks[:1],
                    eval_fingerprint="chain", max_steps=MAX_STEPS, task_types=("chain",))


def chain_collector(n_tasks: int = 4) -> RolloutCollector:
    """The real collector and env pool (in-process) on the chain, with the scripted policy as its engine."""
    suite = chain_suite(n_tasks)
    return RolloutCollector(suite, ScriptedPolicy(), CellPrompts(), lambda n: EnvPool(suite.env_factory, n, 0))


def true_values(gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """``V[t, cell]`` and ``Q[t, cell, a]`` of the scripted policy (t = steps taken so far, 0..MAX_STEPS)."""
    v = np.zeros((MAX_STEPS + 1, LENGTH + 1))
    q = np.zeros((MAX_STEPS + 1, LENGTH + 1, len(ACTIONS)))
    for t in range(MAX_STEPS - 1, -1, -1):
        for cell in range(LENGTH):
            for k, action in enumerate(ACTIONS):
                after = next_cell(cell, action)
                q[t, cell, k] = SUCCESS_REWARD if after == LENGTH else gamma * v[t + 1, after]
            v[t, cell] = float(np.dot(PROBS, q[t, cell]))
    return v, q


@dataclass
class _Prompt:
    ids: list[int]
    truncated: bool = False


class CellPrompts:
    """The collector's prompt builder for the chain: the ids are the cell (the scripted policy ignores them)."""

    def build_many(self, steps):
        return [_Prompt([int(step.observation.split()[4])]) for step in steps]


class ScriptedPolicy:
    """An engine that answers with ``PROBS`` whatever it is asked, renormalised over the commands it may choose
    (like a constrained engine), drawing from torch's RNG (seeded by the caller); it reports the exact log-prob."""

    max_new_tokens = 4
    constrain_to_admissible = True

    def generate(self, prompts, greedy=False, admissible=None, temperature=None, task_texts=None) -> Generation:
        ids, texts, logprobs = [], [], []
        for choices in admissible:
            probs = torch.tensor([PROBS[k] if a in choices else 0.0 for k, a in enumerate(ACTIONS)])
            probs = probs / probs.sum()
            k = int(torch.multinomial(probs, 1))
            ids.append([k])
            texts.append(f"<action>{ACTIONS[k]}</action>")
            logprobs.append([float(torch.log(probs[k]))])
        return Generation(response_ids=ids, texts=texts, logprobs=logprobs, n_generated_tokens=len(prompts))

    def sync_weights(self, model) -> None:
        pass

    def close(self) -> None:
        pass
