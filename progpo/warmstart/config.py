"""Settings of the supervised warm start (``conf/warm_start``; ``model=tiny`` reads it as ``model.warm_start``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WarmStartConfig:
    """Supervised warm start on expert demos (``conf/warm_start``; ``model=tiny`` reads it as ``model.warm_start``).

    n_episodes: expert episodes on training tasks (cycling through ``suite.train_tasks``); 0 = no warm start.
    epochs: passes over the demo steps.
    lr: AdamW peak learning rate (linear warm-up over 5% of the steps, cosine decay to 10%).
    batch_size: demo steps per optimizer step.
    max_steps: cap on optimizer steps (None = ``epochs`` decides).
    max_episode_steps: cap on steps per demo episode (None = ``suite.max_steps``).
    action_noise: fraction of demo steps that execute a random admissible action instead of the expert's.
    invalid_noise: fraction of demo steps that execute a stale command (admissible earlier in the episode,
        not now, e.g. ``go to X`` while at X): the demos then show the env's answer to an invalid command and
        the expert's way on from there, the state a sampling policy most often gets itself into.
    seed: seeds the demo noise, the data order and the model initialisation.
    """

    n_episodes: int = 200
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 32
    max_steps: int | None = None
    max_episode_steps: int | None = None
    action_noise: float = 0.2
    invalid_noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the ``warm_start.*`` key that is out of range."""
        if self.n_episodes < 0:
            raise ValueError(f"warm_start.n_episodes must be >= 0, got {self.n_episodes}")
        if self.epochs < 0 or self.batch_size <= 0:
            raise ValueError("warm_start.epochs must be >= 0 and batch_size > 0")
        if not self.lr > 0:
            raise ValueError(f"warm_start.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.action_noise < 1.0:
            raise ValueError(f"warm_start.action_noise must be in [0, 1), got {self.action_noise}")
        if not 0.0 <= self.invalid_noise < 1.0 or self.action_noise + self.invalid_noise >= 1.0:
            raise ValueError(
                "warm_start.invalid_noise must be in [0, 1) with action_noise + invalid_noise < 1, "
                f"got {self.invalid_noise}"
            )
