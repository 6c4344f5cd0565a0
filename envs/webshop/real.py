"""Adapter for the real WebShop text environment (princeton-nlp/WebShop ``WebAgentTextEnv``).

WebShop cannot be pip-installed (it needs its Google-Drive product data, Java for pyserini, spaCy's
``en_core_web_lg`` and old pins), so it is imported lazily and its absence is a clear error. The adapter is thin:
WebShop pages, search and score are WebShop's own; this module maps them onto ``envs.base`` as verl-agent does:
reward 10 when an episode ends with WebShop's score exactly 1.0, else 0 (the score is ``extra["task_score"]``),
goal indices ``0..n_eval-1`` held out, invalid actions penalised without reaching WebShop, 30 steps at most.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from envs.base import SUCCESS_REWARD, EnvSuite, Observation, StepInfo, Task, not_replayable, tasks_fingerprint
from envs.webshop.actions import admissible_actions, resolve_action

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "Install it from source: `git clone https://github.com/princeton-nlp/WebShop && cd WebShop && "
    "./setup.sh -d small` (or `-d all`; it downloads the product data from Google Drive, needs Java 11+ for "
    "pyserini and spaCy's en_core_web_lg), then pass env.webshop_root=/path/to/WebShop or put it on PYTHONPATH. "
    "Without it, use the offline WebShop-compatible shop: env=webshop."
)


class WebShopNotInstalledError(ImportError):
    """The real WebShop package or its data is missing."""


def _import_text_env_class(webshop_root: str | None) -> type:
    if webshop_root:
        root = os.path.abspath(os.path.expanduser(webshop_root))
        if not os.path.isdir(os.path.join(root, "web_agent_site")):
            raise WebShopNotInstalledError(
                f"env.webshop_root={webshop_root!r} has no web_agent_site/ folder (not a WebShop checkout). "
                + INSTALL_HINT
            )
        if root not in sys.path:
            sys.path.insert(0, root)
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        from web_agent_site.utils import DEFAULT_FILE_PATH
    except (ImportError, OSError) as exc:  # OSError: spaCy model or index files missing at import time
        raise WebShopNotInstalledError(
            f"The real WebShop environment is not importable (web_agent_site.envs.web_agent_text_env: {exc}). "
            + INSTALL_HINT
        ) from exc
    if not os.path.isfile(DEFAULT_FILE_PATH):
        raise WebShopNotInstalledError(
            f"WebShop is importable but its product data is missing ({DEFAULT_FILE_PATH}). Run "
            "`./setup.sh -d small` (or `-d all`) in the WebShop checkout. " + INSTALL_HINT
        )
    return WebAgentTextEnv


def build_text_env(webshop_root: str | None, num_products: int | None, human_goals: bool) -> Any:
    """A WebShop ``WebAgentTextEnv`` in text observation mode (slow: it loads products and the index)."""
    text_env_class = _import_text_env_class(webshop_root)
    return text_env_class(observation_mode="text", num_products=num_products, human_goals=human_goals)


@dataclass(frozen=True)
class RealWebShopEnvFactory:
    """Picklable builder of ``RealWebShopEnv``; each call loads its own WebShop (as verl-agent's workers do).

    webshop_root: WebShop checkout to import from (None: already importable).
    num_products: WebShop's product subset (None: all; WebShop also supports 100, 1000, 100000).
    human_goals: WebShop's human-written goals (True, as in verl-agent) or its synthetic goals.
    """

    webshop_root: str | None = None
    num_products: int | None = None
    human_goals: bool = True
    max_steps: int = 30
    invalid_penalty: float = 0.1

    def __call__(self) -> RealWebShopEnv:
        text_env = build_text_env(self.webshop_root, self.num_products, self.human_goals)
        return RealWebShopEnv(text_env, max_steps=self.max_steps, invalid_penalty=self.invalid_penalty)


class RealWebShopEnv:
    """``envs.base.Env`` over any object with WebShop's text-env interface.

    That interface: ``reset(session=idx) -> (obs, info)``, ``step(action) -> (obs, reward, done, info)``,
    ``get_available_actions() -> {"has_search_bar": bool, "clickables": [str]}`` and ``instruction_text``.
    """

    def __init__(self, text_env: Any, max_steps: int = 30, invalid_penalty: float = 0.1) -> None:
        if max_steps < 1:
            raise ValueError(f"WebShop env: max_steps must be >= 1, got {max_steps}")
        self.text_env = text_env
        self.max_steps = max_steps
        self.invalid_penalty = invalid_penalty
        self._task: Task | None = None
        self._done = True

    def reset(self, task: Task) -> Observation:
        session = task.payload.get("session")
        if not isinstance(session, int):
            raise ValueError(
                f"Task {task.task_id!r}: payload['session'] must be a WebShop goal index (int); "
                "build tasks with envs.webshop.make_real_suite"
            )
        obs, _ = self.text_env.reset(session=session)
        self._task, self._obs, self._steps, self._done = task, obs, 0, False
        return self._observation()

    def step(self, action: str) -> tuple[Observation, float, bool, StepInfo]:
        if self._task is None or self._done:
            raise RuntimeError(
                "RealWebShopEnv.step called before reset() or after the episode ended; call reset(task)"
            )
        self._steps += 1
        available = self.text_env.get_available_actions()
        canonical = resolve_action(action, available["has_search_bar"], available["clickables"])
        score, done, won = 0.0, False, False
        if canonical is None:
            reward = -float(self.invalid_penalty)
        else:
            self._obs, score, done, _ = self.text_env.step(canonical)
            score = float(score)
            won = bool(done) and score == 1.0
            reward = SUCCESS_REWARD if won else 0.0
        truncated = not done and self._steps >= self.max_steps
        self._done = bool(done) or truncated
        extra = {"task_score": score, "truncated": truncated}
        return (
            self._observation(),
            reward,
            self._done,
            StepInfo(won=won, valid=canonical is not None, extra=extra),
        )

    def close(self) -> None:
        close = getattr(self.text_env, "close", None)
        if close is not None:
            close()

    def _observation(self) -> Observation:
        available = self.text_env.get_available_actions() if not self._done else None
        admissible = (
            admissible_actions(available["has_search_bar"], available["clickables"]) if available else ()
        )
        instruction = str(self.text_env.instruction_text).strip()
        if instruction.lower().startswith("instruction:"):
            instruction = instruction[len("instruction:") :].strip()
        return Observation(
            text=self._obs,
            admissible_actions=admissible,
            task_description=instruction,
            task_type=self._task.task_type,
        )


def real_tasks(
    goals: list[dict[str, Any]], n_eval: int, n_train: int | None
) -> tuple[list[Task], list[Task]]:
    """verl-agent's split of WebShop's (already shuffled) goal list: ``[0, n_eval)`` eval, the rest train."""
    if n_eval < 1 or n_eval >= len(goals):
        raise ValueError(
            f"env.n_eval must be in [1, {len(goals) - 1}] for {len(goals)} WebShop goals, got {n_eval}"
        )
    tasks = [
        Task(
            task_id=f"webshop-goal-{i:05d}",
            task_type=str(g.get("category") or "webshop"),
            payload={"session": i},
        )
        for i, g in enumerate(goals)
    ]
    train = tasks[n_eval:]
    if n_train is not None:
        train = train[:n_train]
    return tasks[:n_eval], train


@not_replayable  # a live server: progpo.fidelity cannot restore its states by replay
def make_real_suite(
    webshop_root: str | None = None,
    num_products: int | None = None,
    human_goals: bool = True,
    n_eval: int = 500,
    n_train: int | None = None,
    max_steps: int = 30,
    invalid_penalty: float = 0.1,
) -> EnvSuite:
    """The real WebShop as an ``EnvSuite``; raises ``WebShopNotInstalledError`` (with how to install) if absent."""
    factory = RealWebShopEnvFactory(webshop_root, num_products, human_goals, max_steps, invalid_penalty)
    text_env = build_text_env(webshop_root, num_products, human_goals)
    goals = list(text_env.server.goals)
    text_env.close()
    eval_tasks, train_tasks = real_tasks(goals, n_eval, n_train)
    log.info("real WebShop: %d goals, %d eval, %d train", len(goals), len(eval_tasks), len(train_tasks))
    return EnvSuite(
        name="webshop_real",
        env_factory=factory,
        train_tasks=train_tasks,
        eval_tasks=eval_tasks,
        eval_fingerprint=tasks_fingerprint(eval_tasks),
        max_steps=max_steps,
        task_types=tuple(sorted({t.task_type for t in eval_tasks + train_tasks})),
    )
