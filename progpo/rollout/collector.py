"""Drive environments and the engine in lock-step to produce a rollout batch.

Per step: build the prompt of every *active* env (task, last K (observation, action) pairs, current observation,
admissible actions) -> one batched ``engine.generate`` -> extract the ``<action>`` -> step those envs in parallel
-> record a :class:`Turn`. Finished envs drop out, so no generation is spent on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from envs.base import EnvSuite, Observation, Task, obs_id
from progpo.rollout.projection import project_action
from progpo.types import Episode, RolloutBatch, Turn

log = logging.getLogger(__name__)


class RolloutCollector:
    """Collect rollouts of ``tasks`` x ``group_size`` with one env pool and one engine.

    ``pool_factory(num_envs)`` builds an :class:`envs.pool.EnvPool`; pools are kept per size and re-used, so the
    training batch and the evaluation set each get their workers once.
    """

    def __init__(
        self,
        suite: EnvSuite,
        engine,
        prompt_builder,
        pool_factory: Callable[[int], object],
        max_steps: int | None = None,
    ) -> None:
        self.suite = suite
        self.engine = engine
        self.prompt_builder = prompt_builder
        self.pool_factory = pool_factory
        self.max_steps = max_steps or suite.max_steps
        self._pools: dict[int, object] = {}

    def _pool(self, num_envs: int):
        if num_envs not in self._pools:
            self._pools[num_envs] = self.pool_factory(num_envs)
        return self._pools[num_envs]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def collect(
        self,
        tasks: Sequence[Task],
        group_size: int,
        greedy: bool = False,
        temperature: float | None = None,
        first_group: int = 0,
    ) -> RolloutBatch:
        """Play every task ``group_size`` times; rollouts of task ``g`` form group ``first_group + g``.

        ``temperature`` overrides the engine's sampling temperature (sampled evaluation); ``greedy`` wins.
        ``first_group``: the index of ``tasks[0]`` among the iteration's tasks when a rank plays a share of them;
        trajectory ids are offset alike (``first_group * group_size``), so ids are unique across ranks.
        """
        start = time.perf_counter()
        env_tasks = [task for task in tasks for _ in range(group_size)]
        pool = self._pool(len(env_tasks))
        state = _Playing(env_tasks, list(pool.reset(env_tasks)), group_size, first_group * group_size)
        generated_tokens = env_steps = 0
        # A collection lasts seconds to minutes: say how far it is (finished episodes, longest episode's step).
        bar = tqdm(total=len(env_tasks), desc="episodes", unit="ep", leave=False, mininterval=5)
        while state.active:
            active = list(state.active)
            prompts = [self._prompt(state, i) for i in active]
            generation = self.engine.generate(
                [p.ids for p in prompts],
                greedy=greedy,
                admissible=[state.observations[i].admissible_actions for i in active],
                temperature=temperature,
                task_texts=[state.observations[i].task_description for i in active],
            )
            generated_tokens += generation.n_generated_tokens
            actions = {
                i: project_action(text, state.observations[i].admissible_actions).action or ""
                for i, text in zip(active, generation.texts)
            }
            results = pool.step(actions)
            env_steps += len(active)
            for k, i in enumerate(active):
                state.record(i, prompts[k], generation, k, actions[i], results[i], self.max_steps)
            bar.update(len(active) - len(state.active))
            bar.set_postfix(step=int(state.steps.max()), refresh=False)
        bar.close()
        return RolloutBatch(
            turns=state.turns,
            episodes=state.episodes(),
            rollout_seconds=time.perf_counter() - start,
            generated_tokens=generated_tokens,
            env_steps=env_steps,
        )

    def _prompt(self, state: _Playing, i: int):
        obs = state.observations[i]
        return self.prompt_builder.build(
            task_description=obs.task_description, observation=obs.text, admissible=obs.admissible_actions,
            past=state.history[i],
        )


class _Playing:
    """Per-env state of one collection: current observation, (observation, action) history, counters, turns."""

    def __init__(self, tasks: list[Task], observations: list[Observation], group_size: int,
                 first_traj: int = 0) -> None:
        n = len(tasks)
        self.tasks, self.observations, self.group_size = tasks, observations, group_size
        self.first_traj = first_traj  # global id of env 0's trajectory
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.steps = np.zeros(n, dtype=np.int64)
        self.invalid = np.zeros(n, dtype=np.int64)
        self.won = np.zeros(n, dtype=bool)
        self.errors: list[str | None] = [None] * n
        self.scores: list[float | None] = [None] * n  # the env's task score after the last step (WebShop)
        self.env_metrics: list[dict[str, float]] = [{} for _ in range(n)]
        self.active: list[int] = list(range(n))
        self.turns: list[Turn] = []

    def record(self, i: int, prompt, generation, k: int, action: str, result, max_steps: int) -> None:
        """Env ``i`` took ``action`` (the ``k``-th response of ``generation``): store the turn, advance the env."""
        next_obs, reward, done, info = result
        before = self.observations[i]
        self.steps[i] += 1
        self.invalid[i] += 0 if info.valid else 1
        self.won[i] = self.won[i] or bool(info.won)
        if info.extra.get("error"):
            self.errors[i] = str(info.extra["error"])
        if "task_score" in info.extra:
            self.scores[i] = float(info.extra["task_score"])
        if info.extra.get("episode_metrics"):
            self.env_metrics[i] = {k: float(v) for k, v in info.extra["episode_metrics"].items()}
        traj = self.first_traj + i
        self.turns.append(Turn(
            traj=traj,
            group=traj // self.group_size,
            t=int(self.steps[i] - 1),
            prompt_ids=list(prompt.ids),
            response_ids=list(generation.response_ids[k]),
            sample_logprobs=list(generation.logprobs[k]),
            obs_id=obs_id(before.text),
            response_text=generation.texts[k],
            action=action,
            valid=bool(info.valid),
            reward=float(reward),
            prompt_truncated=bool(prompt.truncated),
            allowed_token_ids=generation.allowed_token_ids[k] if generation.allowed_token_ids else None,
            prompt_hidden=generation.prompt_hidden[k] if generation.prompt_hidden else None,
        ))
        self.history[i].append((before.text, action))
        self.observations[i] = next_obs
        if done or self.steps[i] >= max_steps:
            self.active.remove(i)

    def episodes(self) -> list[Episode]:
        return [
            Episode(traj=self.first_traj + i, group=(self.first_traj + i) // self.group_size, task=task,
                    won=bool(self.won[i]), length=int(self.steps[i]), n_invalid=int(self.invalid[i]),
                    error=self.errors[i], score=self.scores[i], env_metrics=self.env_metrics[i])
            for i, task in enumerate(self.tasks)
        ]
