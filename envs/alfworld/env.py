"""ALFWorld adapter: the real TextWorld engine behind ``envs.base.Env`` and ``envs.base.ExpertEnv``.

One ``AlfWorldEnv`` plays one game at a time and keeps its engine between episodes, so resetting to the same
game (the N rollouts of a task land in the same pool worker) skips loading. Rewards follow the paper:
``SUCCESS_REWARD`` on the winning step, 0 otherwise, ``-invalid_penalty`` for a command that is not admissible.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Literal, get_args

from envs.base import SUCCESS_REWARD, Observation, StepInfo, Task

logger = logging.getLogger(__name__)

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "
NOTHING_HAPPENS = "Nothing happens."
InvalidAction = Literal["stay", "pass"]
INVALID_ACTION_MODES = get_args(InvalidAction)


def normalize_command(text: str) -> str:
    """Case- and whitespace-insensitive form of a command (``" Go  to Fridge 1 "`` -> ``"go to fridge 1"``)."""
    return " ".join(text.strip().lower().split())


def split_intro(feedback: str) -> tuple[str, str]:
    """Split the engine's intro into (room description, goal) without the banner and the ``Your task is to:``."""
    text = feedback.replace(BANNER, "", 1)
    text, sep, goal = text.partition(TASK_PREFIX)
    if not sep:
        raise ValueError(f"ALFWorld intro without a '{TASK_PREFIX.strip()}' sentence: {feedback!r}")
    return text.strip(), goal.strip()


@dataclass(frozen=True)
class AlfWorldEnvFactory:
    """Picklable zero-argument constructor of ``AlfWorldEnv`` (it runs inside pool workers)."""

    max_steps: int = 50
    invalid_penalty: float = 0.1
    invalid_action: str = "stay"

    def __post_init__(self) -> None:
        _check_settings(self.max_steps, self.invalid_penalty, self.invalid_action)

    def __call__(self) -> AlfWorldEnv:
        return AlfWorldEnv(self.max_steps, self.invalid_penalty, self.invalid_action)


def _check_settings(max_steps: int, invalid_penalty: float, invalid_action: str) -> None:
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"env.max_steps must be an integer >= 1, got {max_steps!r}")
    if invalid_penalty < 0:
        raise ValueError(f"env.invalid_penalty must be >= 0 (it is subtracted), got {invalid_penalty!r}")
    if invalid_action not in INVALID_ACTION_MODES:
        raise ValueError(f"env.invalid_action must be one of {INVALID_ACTION_MODES}, got {invalid_action!r}")


class AlfWorldEnv:
    """One ALFWorld game at a time.

    Args:
        max_steps: the episode ends (done, not won) after this many ``step`` calls, invalid ones included.
        invalid_penalty: subtracted from the reward of a step whose command is not admissible.
        invalid_action: ``"stay"`` answers an inadmissible command with "Nothing happens." without touching
            the engine (ALFWorld's own answer); ``"pass"`` hands it to the engine as typed.
    """

    def __init__(
        self, max_steps: int = 50, invalid_penalty: float = 0.1, invalid_action: str = "stay"
    ) -> None:
        _check_settings(max_steps, invalid_penalty, invalid_action)
        self.max_steps = max_steps
        self.invalid_penalty = float(invalid_penalty)
        self.invalid_action = invalid_action
        self._engine: Any = None
        self._game_file: str | None = None
        self._task: Task | None = None
        self._obs: Observation | None = None
        self._lookup: dict[str, str] = {}
        self._steps = 0
        self._done = True
        self._plan: list[str] | None = None

    # -- Env protocol -------------------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        from envs.alfworld.engine import load_game, make_engine

        game_file = task.payload.get("game_file") if isinstance(task.payload, dict) else None
        if not game_file:
            raise ValueError(f"Task {task.task_id!r}: payload['game_file'] (path to game.tw-pddl) is missing")
        if self._engine is None:
            self._engine = make_engine()
        if game_file != self._game_file:
            self._game_file = None
            load_game(self._engine, game_file)
            self._game_file = game_file
        argv = list(sys.argv)
        try:
            state = self._engine.reset()
        finally:
            sys.argv[:] = argv
        text, goal = split_intro(state.feedback)
        self._task = task
        self._steps = 0
        self._done = False
        self._plan = None
        self._obs = self._observation(text, state["admissible_commands"], goal)
        return self._obs

    def step(self, action: str) -> tuple[Observation, float, bool, StepInfo]:
        if self._obs is None or self._done:
            raise RuntimeError(
                "AlfWorldEnv.step called on a finished or never-reset episode; call reset(task)"
            )
        self._steps += 1
        command = self._lookup.get(normalize_command(action))
        if command is None:
            if self.invalid_action == "pass":
                state, _, _ = self._engine.step(action)
                obs = self._observation(
                    state.feedback.strip() or NOTHING_HAPPENS, state["admissible_commands"]
                )
                won = bool(state["won"])
            else:
                obs = self._observation(NOTHING_HAPPENS, self._obs.admissible_actions)
                won = False
            reward = (SUCCESS_REWARD if won else 0.0) - self.invalid_penalty
            info = StepInfo(won=won, valid=False)
        else:
            state, _, _ = self._engine.step(command)
            won = bool(state["won"])
            obs = self._observation(state.feedback.strip(), state["admissible_commands"])
            reward = SUCCESS_REWARD if won else 0.0
            info = StepInfo(won=won, valid=True)
            if self._plan and self._plan[0] == command:
                self._plan.pop(0)
            else:
                self._plan = None
        self._obs = obs
        self._done = won or self._steps >= self.max_steps
        info.extra["steps"] = self._steps
        return obs, reward, self._done, info

    def close(self) -> None:
        from envs.alfworld.engine import close_engine

        if self._engine is not None:
            close_engine(self._engine)
        self._engine = None
        self._game_file = None
        self._obs = None
        self._done = True

    # -- ExpertEnv protocol -------------------------------------------------------------------------------
    def expert_action(self) -> str | None:
        """Next command of ALFWorld's planner expert from the current state (None when done or unsolvable).

        The plan is cached and only recomputed after the agent leaves it, so following the expert costs one
        planner call per episode.
        """
        from envs.alfworld.engine import expert_plan

        if self._obs is None or self._done:
            return None
        if not self._plan:
            self._plan = expert_plan(self._engine)
        if not self._plan:
            return None
        action = self._plan[0]
        if action not in self._lookup.values():
            # The planner's commands use the engine's templates; a mismatch means a plan we cannot follow.
            logger.warning("expert command %r is not admissible in %s", action, self._game_file)
            self._plan = None
            return None
        return action

    # -- helpers ------------------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self._steps

    def _observation(self, text: str, admissible: Any, goal: str | None = None) -> Observation:
        actions = tuple(sorted(admissible))
        self._lookup = {normalize_command(a): a for a in actions}
        assert self._task is not None
        return Observation(
            text=text,
            admissible_actions=actions,
            task_description=goal if goal is not None else self._obs.task_description,
            task_type=self._task.task_type,
        )
