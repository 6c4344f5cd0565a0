"""Expert demonstrations on the training tasks, with action noise so that they also show the way back.

``action_noise`` executes a random admissible action on some steps (the label stays the expert's) so that the
demos also visit off-expert states; ``invalid_noise`` executes a stale command, the state a sampling policy most
often gets itself into. ``focus_episodes`` add clean expert episodes labelled only on some pages (a rare decision,
such as WebShop's option clicks, gets many more examples without relabelling every long page).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from envs.base import EnvSuite
from progpo.config.groups import WarmStartConfig
from progpo.progress import progress_bar
from progpo.rollout.projection import (
    PLACEHOLDER,
    fills_placeholder,
    find_admissible,
    has_placeholder,
    query_words,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoStep:
    """One labelled state: what the policy saw, and the expert's action there."""

    task_description: str
    observation: str
    admissible: tuple[str, ...]
    past: tuple[tuple[str, str], ...]  # (observation, executed action) pairs of the episode so far
    expert_action: str
    episode: int = 0


@dataclass
class DemoStats:
    episodes: int = 0
    steps: int = 0  # labelled steps kept
    noisy_steps: int = 0
    invalid_steps: int = 0
    won: int = 0
    skipped_inadmissible: int = 0  # expert actions not in the admissible list (not used as labels)


def _canonical(action: str, admissible: Sequence[str]) -> str | None:
    """The admissible command ``action`` names: an enumerated one equal to it up to case/whitespace, or ``action``
    itself (whitespace collapsed) when it fills a placeholder command such as ``search[<query>]`` (WebShop's
    expert searches with a query built from the goal's instruction: that query is the label); ``action`` itself
    if nothing is listed; None if it is not admissible."""
    if not admissible:
        return action
    found = find_admissible(action, admissible)
    if found is not None:
        return found
    return " ".join(action.split()) if any(fills_placeholder(action, c) for c in admissible) else None


def collect_demos(suite: EnvSuite, cfg: WarmStartConfig) -> tuple[list[DemoStep], DemoStats]:
    """Run the env's expert (``ExpertEnv.expert_action``) on training tasks, with action noise."""
    return _expert_episodes(suite, cfg, range(cfg.n_episodes), cfg.max_episode_steps or suite.max_steps,
                            "expert demos")


def collect_focus_demos(suite: EnvSuite, cfg: WarmStartConfig) -> tuple[list[DemoStep], DemoStats]:
    """``cfg.focus_episodes`` clean expert episodes on the training tasks after the first ``cfg.n_episodes``
    (cycling), labelled only where the env's ``page_kind`` is one of ``cfg.focus_pages``."""
    if cfg.focus_episodes == 0:
        return [], DemoStats()
    clean = WarmStartConfig(**{**vars(cfg), "action_noise": 0.0, "invalid_noise": 0.0})
    episodes = range(cfg.n_episodes, cfg.n_episodes + cfg.focus_episodes)
    return _expert_episodes(suite, clean, episodes, suite.max_steps, "focus demos", frozenset(cfg.focus_pages))


def _expert_episodes(suite: EnvSuite, cfg: WarmStartConfig, episodes: range, max_steps: int, desc: str,
                     label_pages: frozenset[str] | None = None) -> tuple[list[DemoStep], DemoStats]:
    """The expert's episodes number ``episodes`` (episode k plays training task k, cycling), one env, labelled as
    ``_play_episode`` says."""
    if not suite.train_tasks:
        raise ValueError(f"suite {suite.name!r} has no train_tasks to collect expert demos from")
    rng = random.Random(cfg.seed)
    demos: list[DemoStep] = []
    stats = DemoStats()
    env = suite.env_factory()
    try:
        if not callable(getattr(env, "expert_action", None)):
            raise TypeError(f"{type(env).__name__} has no expert_action(): the warm start needs an ExpertEnv")
        if label_pages is not None and not hasattr(type(env), "page_kind"):
            raise TypeError(
                f"warm_start.focus_episodes needs an env that reports its page (page_kind); {type(env).__name__} "
                "does not: set warm_start.focus_episodes=0"
            )
        for episode in progress_bar(episodes, desc=desc, leave=False, mininterval=5):
            task = suite.train_tasks[episode % len(suite.train_tasks)]
            _play_episode(env, task, episode, max_steps, cfg, rng, demos, stats, label_pages)
            stats.episodes += 1
    finally:
        env.close()
    stats.steps = len(demos)
    if stats.skipped_inadmissible:
        log.warning(
            "%d expert actions were not in the admissible list; not used as labels",
            stats.skipped_inadmissible,
        )
    return demos, stats


def _play_episode(env, task, episode: int, max_steps: int, cfg: WarmStartConfig, rng: random.Random,
                  demos: list[DemoStep], stats: DemoStats, label_pages: frozenset[str] | None = None) -> None:
    """One expert episode: label every state (or those on ``label_pages``) with the expert's command, execute
    it or a noisy one."""
    obs = env.reset(task)
    past: list[tuple[str, str]] = []
    seen: dict[str, None] = {}  # commands admissible earlier in the episode (ordered, no duplicates)
    for _ in range(max_steps):
        expert = env.expert_action()
        if expert is None:
            break
        label = _canonical(expert, obs.admissible_actions)
        if label is None:
            stats.skipped_inadmissible += 1
            label = expert
        elif label_pages is None or env.page_kind in label_pages:
            demos.append(DemoStep(obs.task_description, obs.text, tuple(obs.admissible_actions), tuple(past),
                                  label, episode))
        action = _executed_action(label, obs.admissible_actions, seen, cfg, rng, stats, obs.task_description)
        seen.update(dict.fromkeys(obs.admissible_actions))
        past.append((obs.text, action))
        obs, _reward, done, info = env.step(action)
        if done:
            stats.won += int(info.won)
            break


def _executed_action(label: str, admissible: Sequence[str], seen: dict[str, None], cfg: WarmStartConfig,
                     rng: random.Random, stats: DemoStats, task: str = "") -> str:
    """The expert's ``label``, or (with the configured noise) a stale command or another admissible one.

    A placeholder command (``search[<query>]``) is never executed as listed: its noisy version fills it with a
    few random words of the instruction (a poor search, whose results page the expert then backs out of)."""
    now = set(admissible)
    stale = [a for a in seen if a not in now and not has_placeholder(a)]
    others = [_filled(a, task, rng) if has_placeholder(a) else a for a in admissible]
    others = [a for a in others if a is not None and a != label]
    draw = rng.random()
    if stale and draw < cfg.invalid_noise:
        stats.invalid_steps += 1
        return rng.choice(stale)
    if others and draw < cfg.invalid_noise + cfg.action_noise:
        stats.noisy_steps += 1
        return rng.choice(others)
    return label


def _filled(command: str, task: str, rng: random.Random) -> str | None:
    """``command`` with its placeholder replaced by 1-3 random words of ``task`` (None without words)."""
    words = query_words(task)
    if not words:
        return None
    query = " ".join(rng.sample(words, min(len(words), rng.randint(1, 3))))
    return PLACEHOLDER.sub(query, command, count=1)


def response_text(action: str) -> str:
    """The reasoning-free answer the warm start teaches: ``<action>...</action>``."""
    return f"<action>{action}</action>"
