"""Typed config groups: one dataclass per concept, one name per setting (``conf/<group>/*.yaml``).

The YAML files are where defaults are decided; a field's default here is the value ``python -m progpo.train`` composes
without overrides (``conf/config.yaml``), so a group built in Python is the command line's
(``tests/test_config_defaults.py`` holds the two equal).

``trainer`` holds only what ``lightning.Trainer`` takes; the RL algorithm's settings live in ``ppo``,
held-out evaluation in ``eval``, the iteration schedule in ``schedule`` and the optimiser in ``optim`` (a
``_target_`` component, like lightning-hydra-template's). Each ``check`` raises :class:`ConfigError` naming the
key and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from progpo.hardware import is_batch_rows


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range. The message names the key and the fix."""


def require(ok: bool, key: str, allowed: str, value: Any) -> None:
    """Raise :class:`ConfigError` for ``key`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}. Fix it on the command line, e.g. {key}=...")


# Lightning's precisions, and ``auto``: bf16-mixed where the hardware has native bf16, else 32-true (resolved at
# start-up by ``progpo.hardware.auto_precision``; Lightning never sees "auto").
PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "bf16-true", "16-mixed")


@dataclass
class TrainerConfig:
    """``lightning.Trainer`` keyword arguments (``conf/trainer/*.yaml``), passed through unchanged."""

    accelerator: str = "cpu"
    devices: Any = 1  # an int, a list of device ids or "auto"
    num_nodes: int = 1
    strategy: Any = "auto"  # any Lightning strategy name ("ddp", "fsdp", ...) or object
    precision: str = "auto"

    def check(self) -> None:
        require(self.accelerator in ("cpu", "gpu", "cuda", "auto"), "trainer.accelerator",
                "one of cpu, gpu, cuda, auto", self.accelerator)
        if isinstance(self.devices, int):
            require(self.devices >= 1, "trainer.devices", ">= 1, a list of ids or auto", self.devices)
        require(self.num_nodes >= 1, "trainer.num_nodes", ">= 1", self.num_nodes)
        require(self.precision in PRECISIONS, "trainer.precision", f"one of {', '.join(PRECISIONS)}", self.precision)

    @property
    def uses_cuda(self) -> bool:
        return self.accelerator in ("gpu", "cuda")

    @property
    def world_size(self) -> int:
        """Processes of the run, as Lightning counts them: devices per node x nodes."""
        devices = self.devices
        if isinstance(devices, str) and "," in devices:  # "0,1": device ids
            devices = [d for d in devices.split(",") if d.strip()]
        if isinstance(devices, (list, tuple)):
            per_node = len(devices)
        elif str(devices).isdigit() and int(devices) >= 1:
            per_node = int(devices)
        else:  # "auto" or -1: every visible GPU; one process on CPU
            import torch

            per_node = max(torch.cuda.device_count(), 1) if self.accelerator != "cpu" else 1
        return per_node * self.num_nodes


def world_size_mismatch(saved: int, now: int) -> str:
    """The message for resuming a checkpoint with another number of processes."""
    return (f"the checkpoint was written by a run with world size {saved} (trainer.devices x trainer.num_nodes) "
            f"but this run has world size {now}; resume with the same world size (the task shares, RNG streams "
            "and minibatch split of each rank depend on it), or start a new run")


@dataclass
class PPOConfig:
    """The clipped-surrogate update of one iteration (``conf/ppo/*.yaml``).

    epochs: passes over the rollout batch. minibatch_size: steps per optimizer step. micro_batch_size: steps per
    forward/backward (gradient accumulation inside a minibatch; also the scoring batch), or ``auto``: 64 on an
    AMX-BF16 CPU in bf16, else 32 (resolved at start-up, ``progpo.hardware.auto_batch_rows``). clip_ratio: PPO clip.
    kl_coef: weight of the low-variance KL to the frozen reference (0: no reference is built). entropy_coef:
    entropy bonus. max_grad_norm: gradient clipping. skip_zero_advantage: leave steps whose advantage is exactly
    0 out of the update (they carry no policy gradient; KL and entropy then act on the updated steps only).
    recompute_old_logprobs: run the no-grad actor pass for old log-probs and embeddings even when the engine
    already computed them with the actor while sampling (HF engine at temperature 1); vLLM turns always get it.
    """

    epochs: int = 1
    minibatch_size: int = 256
    micro_batch_size: Any = "auto"  # an int or "auto"
    clip_ratio: float = 0.2
    kl_coef: float = 0.01
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    skip_zero_advantage: bool = True
    recompute_old_logprobs: bool = False

    def check(self) -> None:
        require(self.epochs >= 1, "ppo.epochs", ">= 1", self.epochs)
        require(self.minibatch_size >= 1, "ppo.minibatch_size", ">= 1", self.minibatch_size)
        require(is_batch_rows(self.micro_batch_size), "ppo.micro_batch_size", "an int >= 1 or auto",
                self.micro_batch_size)
        require(self.clip_ratio > 0, "ppo.clip_ratio", "> 0", self.clip_ratio)
        require(self.kl_coef >= 0, "ppo.kl_coef", ">= 0", self.kl_coef)
        require(self.entropy_coef >= 0, "ppo.entropy_coef", ">= 0", self.entropy_coef)
        require(self.max_grad_norm > 0, "ppo.max_grad_norm", "> 0", self.max_grad_norm)


@dataclass
class EvalConfig:
    """Held-out evaluation (``conf/eval/*.yaml``): ``episodes_per_task`` episodes per ``env`` held-out task.

    every: evaluate every N iterations (and always at the start and the end). temperature: sampling temperature
    of the held-out episodes; 0 = greedy. episodes_per_task: sampled episodes per held-out task; the metrics are
    over all of them, so k episodes shrink the sampling noise of a held-out number like k times more tasks would
    (without changing the held-out set, which the warm start's cache key and the paper's tables depend on).
    """

    every: int = 5
    temperature: float = 1.0
    episodes_per_task: int = 1

    def check(self) -> None:
        require(self.every >= 1, "eval.every", ">= 1", self.every)
        require(self.temperature >= 0, "eval.temperature", ">= 0 (0 = greedy)", self.temperature)
        require(self.episodes_per_task >= 1, "eval.episodes_per_task", ">= 1", self.episodes_per_task)
        require(self.temperature > 0 or self.episodes_per_task == 1, "eval.episodes_per_task",
                "1 when eval.temperature=0 (greedy episodes of a task are all the same; sample with "
                "eval.temperature > 0 to average several)", self.episodes_per_task)


@dataclass
class ScheduleConfig:
    """How long a run is and what it writes on the way (``conf/schedule/*.yaml``).

    max_iterations: RL iterations (one rollout batch and its update each). ckpt_every: a periodic
    ``iter-XXXX.ckpt`` every N iterations (``last.ckpt`` is written after every iteration).
    log_trajectories_every: sampled trajectories to the logger every N iterations (0 = never).
    """

    max_iterations: int = 10
    ckpt_every: int = 5
    log_trajectories_every: int = 10

    def check(self) -> None:
        require(self.max_iterations >= 1, "schedule.max_iterations", ">= 1", self.max_iterations)
        require(self.ckpt_every >= 1, "schedule.ckpt_every", ">= 1", self.ckpt_every)
        require(self.log_trajectories_every >= 0, "schedule.log_trajectories_every", ">= 0",
                self.log_trajectories_every)


@dataclass
class RolloutConfig:
    """How rollout batches are collected (``conf/shared/rollout_batch.yaml`` and the engine files that include it); ``engine``
    is a ``_target_`` component, checked against its class, with no default of its own here."""

    engine: dict[str, Any] = field(default_factory=dict)
    tasks_per_batch: int = 16
    group_size: int = 8
    history: int = 2
    num_workers: int = 2
    step_timeout: float = 60.0
    max_prompt_tokens: int | None = None

    def check(self) -> None:
        require(self.tasks_per_batch >= 1, "rollout.tasks_per_batch", ">= 1", self.tasks_per_batch)
        require(self.group_size >= 1, "rollout.group_size", ">= 1", self.group_size)
        require(self.history >= 0, "rollout.history", ">= 0", self.history)
        require(self.num_workers >= 0, "rollout.num_workers", ">= 0 (0 = in-process envs)", self.num_workers)
        require(self.step_timeout > 0, "rollout.step_timeout", "> 0 seconds", self.step_timeout)
        if self.max_prompt_tokens is not None:
            require(self.max_prompt_tokens >= 16, "rollout.max_prompt_tokens", ">= 16 or null",
                    self.max_prompt_tokens)


WARM_START_PRECISIONS = ("32-true", "bf16-mixed", "auto")


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
    precision: ``32-true`` (float32), ``bf16-mixed`` (bf16 autocast; weights, optimizer state and loss in float32)
        or ``auto`` (bf16-mixed where the CPU or GPU has native bf16, as ``trainer.precision=auto``). A warm start
        built in bf16 is another policy, so it is cached under a key of its own.
    focus_episodes: a second SFT stage, on top of the (cached) warm start above: clean expert episodes (no noise, on
        the training tasks after the first ``n_episodes``) labelled only on the pages ``focus_pages`` names, mixed
        with ``focus_replay_episodes`` ordinary demo episodes so the rest is not forgotten. It gives a rare,
        decisive choice (WebShop's option clicks on item pages: 1.5 per episode, ~15% of the labels) many more
        examples without labelling every long page again. 0 = no second stage. Needs an env whose expert reports its
        page (``page_kind``).
    focus_pages: the page kinds the focus episodes label (WebShop: search, results, item, sub).
    focus_epochs, focus_lr: passes over the focus stage's data and its peak learning rate.
    focus_replay_episodes: ordinary (noisy) demo episodes mixed into the focus stage (tasks from the first, other
        noise draws).
    """

    n_episodes: int = 400
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 32
    max_steps: int | None = None
    max_episode_steps: int | None = None
    action_noise: float = 0.2
    invalid_noise: float = 0.1
    seed: int = 0
    precision: str = "32-true"
    focus_episodes: int = 0
    focus_pages: tuple[str, ...] = ()
    focus_epochs: int = 2
    focus_lr: float = 5e-4
    focus_replay_episodes: int = 100

    def __post_init__(self) -> None:
        if isinstance(self.focus_pages, str):
            self.focus_pages = (self.focus_pages,)
        self.focus_pages = tuple(str(p) for p in self.focus_pages)  # a Hydra ListConfig arrives here too
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the ``warm_start.*`` key that is out of range."""
        if self.n_episodes < 0:
            raise ValueError(f"warm_start.n_episodes must be >= 0, got {self.n_episodes}")
        if self.epochs < 0 or self.batch_size <= 0:
            raise ValueError("warm_start.epochs must be >= 0 and batch_size > 0")
        if not self.lr > 0:
            raise ValueError(f"warm_start.lr must be > 0, got {self.lr}")
        if self.precision not in WARM_START_PRECISIONS:
            raise ValueError(f"warm_start.precision must be one of {', '.join(WARM_START_PRECISIONS)}, got "
                             f"{self.precision!r}")
        if not 0.0 <= self.action_noise < 1.0:
            raise ValueError(f"warm_start.action_noise must be in [0, 1), got {self.action_noise}")
        if not 0.0 <= self.invalid_noise < 1.0 or self.action_noise + self.invalid_noise >= 1.0:
            raise ValueError(
                "warm_start.invalid_noise must be in [0, 1) with action_noise + invalid_noise < 1, "
                f"got {self.invalid_noise}"
            )
        for name in ("focus_episodes", "focus_epochs", "focus_replay_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"warm_start.{name} must be >= 0, got {getattr(self, name)}")
        if not self.focus_lr > 0:
            raise ValueError(f"warm_start.focus_lr must be > 0, got {self.focus_lr}")
        if self.focus_episodes > 0 and not self.focus_pages:
            raise ValueError(
                "warm_start.focus_pages is empty but warm_start.focus_episodes > 0: name the page kinds to label, "
                "e.g. warm_start.focus_pages=[item] (WebShop), or set warm_start.focus_episodes=0"
            )


# The plain (non-``_target_``) groups of the run config and their schemas.
TYPED_GROUPS: dict[str, type] = {"trainer": TrainerConfig, "ppo": PPOConfig, "eval": EvalConfig,
                                 "schedule": ScheduleConfig, "rollout": RolloutConfig}


@dataclass
class RunConfig:
    """The typed parts of a validated config, handed to the builders."""

    trainer: TrainerConfig
    ppo: PPOConfig
    eval: EvalConfig
    schedule: ScheduleConfig
    rollout: RolloutConfig
    torch_threads: int | None = None
