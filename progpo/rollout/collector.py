"""Drive environments and the engine in lock-step to produce a rollout batch.

Per step: build the prompt of every *active* env (task, last K (observation, action) pairs, current observation,
admissible actions) -> one batched ``engine.generate`` -> extract the ``<action>`` -> step those envs in parallel
-> record a :class:`Turn`. Finished envs drop out, so no generation is spent on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from envs.base import EnvSuite, Observation, Task, obs_id
from progpo.progress import progress_bar
from progpo.rollout.projection import project_action
from progpo.rollout.prompt import PromptStep
from progpo.types import Episode, RolloutBatch, Turn

log = logging.getLogger(__name__)


class RolloutCollector:
    """Collect rollouts of ``tasks`` x ``group_size`` with one env pool and one engine.

    ``pool_factory(num_envs)`` builds an :class:`envs.pool.EnvPool` on first use; later batches of another size
    (the held-out set, the training batch) resize that pool, so a run starts its env workers once.
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
        self._env_pool = None

    def _pool(self, num_envs: int):
        if self._env_pool is None:
            self._env_pool = self.pool_factory(num_envs)
        else:
            self._env_pool.resize(num_envs)
        return self._env_pool

    def warm_up(self, tasks: Sequence[Task], group_size: int) -> float:
        """Start the env workers a ``collect(tasks, group_size)`` uses and load its tasks' games (one reset);
        returns the seconds it took. The first reset of a pool starts its processes and fills their game caches
        (~10 s for the default batch against ~1 s later), so a benchmark warms up before it times a rollout."""
        start = time.perf_counter()
        env_tasks = [task for task in tasks for _ in range(group_size)]
        self._pool(len(env_tasks)).reset(env_tasks)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._env_pool is not None:
            self._env_pool.close()
            self._env_pool = None

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
        timing = self._play(state, pool, greedy, temperature, desc="episodes")
        return RolloutBatch(
            turns=state.turns,
            episodes=state.episodes(),
            rollout_seconds=time.perf_counter() - start,
            generated_tokens=timing.generated_tokens,
            env_steps=timing.env_steps,
        )

    def continue_from(self, starts: Sequence[EpisodeStart], temperature: float | None = None,
                      desc: str | None = None) -> ContinuationBatch:
        """Play episodes that begin with a recorded prefix: reset each env on its task, replay the start's actions
        (checking every observation and reward against the record), then sample with the policy to the episode's
        end or step limit, exactly as :meth:`collect` plays (same prompts, history window and temperature).
        ``desc``: a progress bar's label (None: no bar; the caller shows progress over many calls).

        A start whose replay differs from its record is stopped there and reported (``diverged_at``); its
        episode is not continued. Continued steps are not kept as turns, only their rewards.
        """
        started = time.perf_counter()
        tasks = [s.task for s in starts]
        pool = self._pool(len(tasks))
        state = _Playing(tasks, list(pool.reset(tasks)), group_size=1, keep_turns=False)
        state.exclude = [s.exclude_first for s in starts]
        diverged: list[int | None] = [None] * len(starts)
        for i, s in enumerate(starts):
            if obs_id(state.observations[i].text) != s.expected_obs[0]:
                diverged[i] = 0
        replaying = [i for i, s in enumerate(starts) if diverged[i] is None and s.actions]
        u = replay_steps = 0
        while replaying:
            results = pool.step({i: starts[i].actions[u] for i in replaying})
            replay_steps += len(replaying)
            for i in replaying:
                if not starts[i].matches(u, results[i]):
                    diverged[i] = u
                state.advance(i, starts[i].actions[u], results[i], self.max_steps)
            u += 1
            replaying = [i for i in replaying
                         if diverged[i] is None and i in state.active and u < len(starts[i].actions)]
        for i, s in enumerate(starts):
            if diverged[i] is None and (i in state.active) != s.continues:
                diverged[i] = len(s.actions)  # the record went on where the replay ended, or the other way round
            if diverged[i] is not None and i in state.active:
                state.active.remove(i)
        replay_s = time.perf_counter() - started
        timing = self._play(state, pool, greedy=False, temperature=temperature, desc=desc)
        episodes = [
            ContinuedEpisode(rewards=list(state.rewards[i]), won=bool(state.won[i]), diverged_at=diverged[i],
                             error=state.errors[i], excluded=bool(state.excluded[i]))
            for i in range(len(starts))
        ]
        timing.replay_seconds, timing.replay_steps, timing.episodes = replay_s, replay_steps, len(starts)
        return ContinuationBatch(episodes, timing)

    def _play(self, state: _Playing, pool, greedy: bool, temperature: float | None, desc: str | None
              ) -> PlayTiming:
        """The lock-step loop: prompts of the active envs -> one batched generate -> project -> step them."""
        timing = PlayTiming()
        # A collection lasts seconds to minutes: say how far it is (finished episodes, longest episode's step).
        bar = progress_bar(total=len(state.tasks), initial=len(state.tasks) - len(state.active), desc=desc, unit="ep",
                   leave=False, mininterval=5, disable=desc is None)
        while state.active:
            active = list(state.active)
            prompts = self.prompt_builder.build_many([self._prompt_step(state, i) for i in active])
            started = time.perf_counter()
            generation = self.engine.generate(
                [p.ids for p in prompts],
                greedy=greedy,
                admissible=[state.sampling_choices(i) for i in active],
                temperature=temperature,
                task_texts=[state.observations[i].task_description for i in active],
            )
            timing.generate_seconds += time.perf_counter() - started
            timing.generated_tokens += generation.n_generated_tokens
            actions = {
                i: project_action(text, state.observations[i].admissible_actions).action or ""
                for i, text in zip(active, generation.texts)
            }
            started = time.perf_counter()
            results = pool.step(actions)
            timing.env_seconds += time.perf_counter() - started
            timing.env_steps += len(active)
            for k, i in enumerate(active):
                state.record(i, prompts[k], generation, k, actions[i], results[i], self.max_steps)
            bar.update(len(active) - len(state.active))
            bar.set_postfix(step=int(state.steps.max()), refresh=False)
        bar.close()
        return timing

    @staticmethod
    def _prompt_step(state: _Playing, i: int) -> PromptStep:
        obs = state.observations[i]
        return PromptStep(task_description=obs.task_description, observation=obs.text,
                          admissible=obs.admissible_actions, past=state.history[i])


@dataclass(frozen=True)
class EpisodeStart:
    """An episode to play from a recorded prefix (``RolloutCollector.continue_from``).

    ``actions`` are replayed in a fresh env of ``task``; ``expected_obs[u]`` is the ``obs_id`` of the observation
    recorded before action ``u`` and ``expected_rewards[u]`` the reward recorded for it. ``expected_obs`` has one
    more entry than ``actions`` when the recorded episode went on after the last replayed action (the observation
    the replay must arrive at), as many when it ended there.
    """

    task: Task
    actions: tuple[str, ...]
    expected_obs: tuple[int, ...]
    expected_rewards: tuple[float, ...]
    # Leave this command out of the admissible ones at the first sampled step (a constrained engine then samples
    # from the policy renormalised over the other commands); kept when it is not admissible as written (a
    # placeholder such as search[<query>] stands for it) or is the only admissible one.
    exclude_first: str | None = None

    def __post_init__(self) -> None:
        if len(self.expected_rewards) != len(self.actions):
            raise ValueError("EpisodeStart: one expected reward per replayed action")
        if len(self.expected_obs) not in (len(self.actions), len(self.actions) + 1) or not self.expected_obs:
            raise ValueError("EpisodeStart: expected_obs needs one id per replayed action, plus the next one if "
                             "the recorded episode went on (and at least the first observation)")

    @property
    def continues(self) -> bool:
        """Whether the recorded episode went on after the replayed actions."""
        return len(self.expected_obs) > len(self.actions)

    def matches(self, u: int, result) -> bool:
        """Whether replaying action ``u`` gave the recorded reward and arrived at the recorded observation."""
        next_obs, reward, _done, info = result
        if info.extra.get("error") or abs(float(reward) - self.expected_rewards[u]) > 1e-9:
            return False
        return u + 1 >= len(self.expected_obs) or obs_id(next_obs.text) == self.expected_obs[u + 1]


@dataclass
class ContinuedEpisode:
    """One played start: every step's reward (the replayed ones first), whether it was won, and where its replay
    left the record (None: it matched throughout and the episode was played on)."""

    rewards: list[float]
    won: bool
    diverged_at: int | None
    error: str | None = None
    excluded: bool = False  # ``exclude_first`` was admissible, not alone, and left out of the first sampled step


@dataclass
class PlayTiming:
    """Where a collection's time went and how much it played; ``add`` sums them (e.g. over chunks of starts)."""

    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    generated_tokens: int = 0
    env_steps: int = 0
    replay_seconds: float = 0.0  # ``continue_from`` only: restoring the recorded prefixes
    replay_steps: int = 0
    episodes: int = 0

    def add(self, other: PlayTiming) -> None:
        for name in vars(other):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class ContinuationBatch:
    """``continue_from``'s episodes (in the order of the starts) and where the time went."""

    episodes: list[ContinuedEpisode]
    timing: PlayTiming


class _Playing:
    """Per-env state of one collection: current observation, (observation, action) history, counters, turns."""

    def __init__(self, tasks: list[Task], observations: list[Observation], group_size: int,
                 first_traj: int = 0, keep_turns: bool = True) -> None:
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
        self.keep_turns = keep_turns  # False: continuations keep rewards only (thousands of episodes)
        self.rewards: list[list[float]] = [[] for _ in range(n)]
        self.exclude: list[str | None] = [None] * n  # see ``EpisodeStart.exclude_first``
        self.excluded = np.zeros(n, dtype=bool)  # the first sampled step did leave that command out

    def sampling_choices(self, i: int) -> tuple[str, ...]:
        """The commands env ``i``'s next action is decoded among: the admissible ones, less an excluded one."""
        admissible = self.observations[i].admissible_actions
        excluded = self.exclude[i]
        if excluded is None or excluded not in admissible or len(admissible) < 2:
            return admissible
        self.excluded[i] = True
        return tuple(a for a in admissible if a != excluded)

    def record(self, i: int, prompt, generation, k: int, action: str, result, max_steps: int) -> None:
        """Env ``i`` took ``action`` (the ``k``-th response of ``generation``): store the turn, advance the env."""
        next_obs, reward, done, info = result
        before = self.observations[i]
        if self.keep_turns:
            traj = self.first_traj + i
            self.turns.append(Turn(
                traj=traj,
                group=traj // self.group_size,
                t=int(self.steps[i]),
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
        self.exclude[i] = None  # only the first sampled step leaves a command out
        self.advance(i, action, result, max_steps)

    def advance(self, i: int, action: str, result, max_steps: int) -> None:
        """Env ``i`` took ``action`` and the env answered ``result``: counters, history, observation, end."""
        next_obs, reward, done, info = result
        self.steps[i] += 1
        self.invalid[i] += 0 if info.valid else 1
        self.won[i] = self.won[i] or bool(info.won)
        self.rewards[i].append(float(reward))
        if info.extra.get("error"):
            self.errors[i] = str(info.extra["error"])
        if "task_score" in info.extra:
            self.scores[i] = float(info.extra["task_score"])
        if info.extra.get("episode_metrics"):
            self.env_metrics[i] = {k: float(v) for k, v in info.extra["episode_metrics"].items()}
        self.history[i].append((self.observations[i].text, action))
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
