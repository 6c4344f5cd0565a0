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
    ) -> RolloutBatch:
        """Play every task ``group_size`` times; rollouts of task ``g`` form group ``g``.

        ``temperature`` overrides the engine's sampling temperature (sampled evaluation); ``greedy`` wins.
        """
        start = time.perf_counter()
        env_tasks = [task for task in tasks for _ in range(group_size)]
        num_envs = len(env_tasks)
        pool = self._pool(num_envs)
        observations: list[Observation] = list(pool.reset(env_tasks))
        history: list[list[tuple[str, str]]] = [[] for _ in range(num_envs)]
        turns: list[Turn] = []
        steps = np.zeros(num_envs, dtype=np.int64)
        invalid = np.zeros(num_envs, dtype=np.int64)
        won = np.zeros(num_envs, dtype=bool)
        errors: list[str | None] = [None] * num_envs
        active = list(range(num_envs))
        generated_tokens = 0
        env_steps = 0

        while active:
            prompts = [
                self.prompt_builder.build(
                    task_description=observations[i].task_description,
                    observation=observations[i].text,
                    admissible=observations[i].admissible_actions,
                    past=history[i],
                )
                for i in active
            ]
            generation = self.engine.generate(
                [p.ids for p in prompts],
                greedy=greedy,
                admissible=[observations[i].admissible_actions for i in active],
                temperature=temperature,
            )
            generated_tokens += generation.n_generated_tokens
            actions = {
                i: project_action(text, observations[i].admissible_actions).action or ""
                for i, text in zip(active, generation.texts)
            }
            results = pool.step(actions)
            env_steps += len(active)
            still_active = []
            for k, i in enumerate(active):
                obs_before = observations[i]
                next_obs, reward, done, info = results[i]
                steps[i] += 1
                if steps[i] >= self.max_steps:
                    done = True
                invalid[i] += 0 if info.valid else 1
                won[i] = won[i] or bool(info.won)
                if info.extra.get("error"):
                    errors[i] = str(info.extra["error"])
                turns.append(
                    Turn(
                        traj=i,
                        group=i // group_size,
                        t=int(steps[i] - 1),
                        prompt_ids=list(prompts[k].ids),
                        response_ids=list(generation.response_ids[k]),
                        sample_logprobs=list(generation.logprobs[k]),
                        obs_id=obs_id(obs_before.text),
                        response_text=generation.texts[k],
                        action=actions[i],
                        valid=bool(info.valid),
                        reward=float(reward),
                        prompt_truncated=bool(prompts[k].truncated),
                        allowed_token_ids=(
                            generation.allowed_token_ids[k] if generation.allowed_token_ids else None
                        ),
                    )
                )
                history[i].append((obs_before.text, actions[i]))
                observations[i] = next_obs
                if not done:
                    still_active.append(i)
            active = still_active

        episodes = [
            Episode(
                traj=i,
                group=i // group_size,
                task=env_tasks[i],
                won=bool(won[i]),
                length=int(steps[i]),
                n_invalid=int(invalid[i]),
                error=errors[i],
            )
            for i in range(num_envs)
        ]
        return RolloutBatch(
            turns=turns,
            episodes=episodes,
            rollout_seconds=time.perf_counter() - start,
            generated_tokens=generated_tokens,
            env_steps=env_steps,
        )
