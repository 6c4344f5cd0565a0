"""The one protocol every environment implements.

The collector (``progpo.rollout``) drives any environment through ``reset``/``step`` only, so a new
benchmark is one adapter module plus one YAML file under ``conf/env/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

SUCCESS_REWARD = 10.0  # paper setup: 10 on the winning step, 0 otherwise


@dataclass(frozen=True)
class Task:
    """One task instance. The N rollouts of a task in a batch all get the same ``Task``."""

    task_id: str  # stable identifier (e.g. the game folder relative to the data root, or a goal index)
    task_type: str  # e.g. "pick_and_place_simple"; used for per-type success metrics
    payload: dict[str, Any] = field(default_factory=dict)  # what the env needs to load it (paths, goal, ...)


@dataclass(frozen=True)
class Observation:
    """What the agent sees before acting."""

    text: str  # raw environment observation for this step, without any prompt history
    admissible_actions: tuple[str, ...]  # commands the env accepts now (may be empty if unknown)
    task_description: str  # the goal in natural language
    task_type: str


@dataclass
class StepInfo:
    """Per-step information returned by ``Env.step``."""

    won: bool = False
    valid: bool = True  # False when the action was not admissible (the penalty is already in the reward)
    extra: dict[str, Any] = field(default_factory=dict)  # env specific, e.g. WebShop ``task_score``


@runtime_checkable
class Env(Protocol):
    """A text environment. Implementations must be picklable or constructible inside a worker process."""

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: str) -> tuple[Observation, float, bool, StepInfo]: ...

    def close(self) -> None: ...


@runtime_checkable
class ExpertEnv(Protocol):
    """An environment that can tell the expert's next action in its current state (for demos and tests)."""

    def expert_action(self) -> str | None: ...


@dataclass
class EnvSuite:
    """Everything the trainer needs from a benchmark, built by the Hydra ``env`` component.

    ``env_factory`` is a picklable zero-argument callable that builds one ``Env`` (it runs inside pool workers).
    ``train_tasks`` and ``eval_tasks`` are disjoint and in a fixed order; ``eval_fingerprint`` identifies the
    held-out set (logged so that runs can be checked to be evaluated on the same tasks).
    """

    name: str
    env_factory: Any
    train_tasks: list[Task]
    eval_tasks: list[Task]
    eval_fingerprint: str
    max_steps: int
    task_types: tuple[str, ...]


def cache_root() -> Path:
    """Where generated games, catalogues and built models are cached: ``$PROGPO_CACHE_DIR`` or ``~/.cache/progpo``."""
    return Path(os.environ.get("PROGPO_CACHE_DIR") or Path.home() / ".cache" / "progpo")


def obs_id(text: str) -> int:
    """Stable signed 64-bit id of an observation text: identical across processes, machines and runs."""
    import hashlib

    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def tasks_fingerprint(tasks: list[Task]) -> str:
    """Short hash of an ordered task list (used to identify the held-out set in logs)."""
    import hashlib

    h = hashlib.sha256()
    for task in tasks:
        h.update(task.task_id.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def not_replayable(suite_factory):
    """Mark an env suite factory whose episodes cannot be restored by replaying their actions (a live server whose
    state or catalogue can change between episodes): ``progpo.fidelity`` measures advantages by such replays and
    refuses it. Every other env must be deterministic given its task and actions."""
    suite_factory.replayable = False
    return suite_factory


def is_replayable(suite_factory) -> bool:
    """Whether the env built by ``suite_factory`` (a ``conf/env`` ``_target_``) replays deterministically."""
    return bool(getattr(suite_factory, "replayable", True))
