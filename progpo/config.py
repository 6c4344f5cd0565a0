"""Start-up validation of the composed Hydra config.

Every run goes through :func:`validate_config` before any model or environment is built, so that a typo or an
out-of-range value fails in a second with a message naming the key and the allowed range, not twenty minutes
into a run. Plain groups (``trainer``, ``rollout``) are typed dataclasses; ``_target_`` components (``credit``,
``env``, ``model``, ``rollout.engine``, ``logger``) are checked against the signature of their target, and the
credit estimator is constructed (it is cheap and pure) so that its own range checks run.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of range. The message names the key and the fix."""


@dataclass
class TrainerConfig:
    """Optimisation, evaluation and checkpoint schedule (``conf/trainer/*.yaml``)."""

    max_iterations: int = 30
    lr: float = 2e-5
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    minibatch_size: int = 128
    micro_batch_size: int = 32
    clip_ratio: float = 0.2
    kl_coef: float = 0.01
    entropy_coef: float = 0.0
    grad_clip: float = 1.0
    skip_zero_advantage: bool = False
    val_every: int = 5
    val_temperature: float = 0.4
    ckpt_every: int = 5
    log_trajectories_every: int = 10
    accelerator: str = "cpu"
    devices: int = 1
    precision: str = "32-true"
    num_threads: int | None = None

    def check(self) -> None:
        _require(self.max_iterations >= 1, "trainer.max_iterations", ">= 1", self.max_iterations)
        _require(self.lr > 0, "trainer.lr", "> 0", self.lr)
        _require(self.weight_decay >= 0, "trainer.weight_decay", ">= 0", self.weight_decay)
        _require(self.ppo_epochs >= 1, "trainer.ppo_epochs", ">= 1", self.ppo_epochs)
        _require(self.minibatch_size >= 1, "trainer.minibatch_size", ">= 1", self.minibatch_size)
        _require(self.micro_batch_size >= 1, "trainer.micro_batch_size", ">= 1", self.micro_batch_size)
        _require(self.clip_ratio > 0, "trainer.clip_ratio", "> 0", self.clip_ratio)
        _require(self.kl_coef >= 0, "trainer.kl_coef", ">= 0", self.kl_coef)
        _require(self.entropy_coef >= 0, "trainer.entropy_coef", ">= 0", self.entropy_coef)
        _require(self.grad_clip > 0, "trainer.grad_clip", "> 0", self.grad_clip)
        _require(self.val_every >= 1, "trainer.val_every", ">= 1", self.val_every)
        _require(self.val_temperature >= 0, "trainer.val_temperature", ">= 0 (0 = greedy)", self.val_temperature)
        _require(self.ckpt_every >= 1, "trainer.ckpt_every", ">= 1", self.ckpt_every)
        _require(self.log_trajectories_every >= 0, "trainer.log_trajectories_every", ">= 0",
                 self.log_trajectories_every)
        _require(self.accelerator in ("cpu", "gpu", "cuda", "auto"), "trainer.accelerator",
                 "one of cpu, gpu, cuda, auto", self.accelerator)
        _require(self.devices >= 1, "trainer.devices", ">= 1", self.devices)
        _require(self.precision in ("32-true", "32", "bf16-mixed", "bf16-true", "16-mixed"), "trainer.precision",
                 "one of 32-true, bf16-mixed, bf16-true, 16-mixed", self.precision)
        if self.num_threads is not None:
            _require(self.num_threads >= 1, "trainer.num_threads", ">= 1 or null", self.num_threads)


@dataclass
class RolloutConfig:
    """How rollout batches are collected (``conf/rollout/*.yaml``); ``engine`` is a ``_target_`` component."""

    engine: dict[str, Any] = field(default_factory=dict)
    tasks_per_batch: int = 4
    group_size: int = 8
    history: int = 2
    num_workers: int = 2
    step_timeout: float = 60.0
    max_prompt_tokens: int | None = None

    def check(self) -> None:
        _require(self.tasks_per_batch >= 1, "rollout.tasks_per_batch", ">= 1", self.tasks_per_batch)
        _require(self.group_size >= 1, "rollout.group_size", ">= 1", self.group_size)
        _require(self.history >= 0, "rollout.history", ">= 0", self.history)
        _require(self.num_workers >= 0, "rollout.num_workers", ">= 0 (0 = in-process envs)", self.num_workers)
        _require(self.step_timeout > 0, "rollout.step_timeout", "> 0 seconds", self.step_timeout)
        if self.max_prompt_tokens is not None:
            _require(self.max_prompt_tokens >= 16, "rollout.max_prompt_tokens", ">= 16 or null",
                     self.max_prompt_tokens)


TOP_LEVEL_KEYS = {
    "env", "model", "credit", "rollout", "trainer", "logger", "seed", "objective", "resume", "ckpt_path",
    "run_name", "run_dir", "ablation",
}

# Ranges shared by keys that several ``_target_`` components use, checked before the component is built.
_COMMON_RANGES: dict[str, tuple[Any, str]] = {
    "max_steps": (lambda v: v >= 1, ">= 1"),
    "n_train": (lambda v: v >= 1, ">= 1"),
    "n_eval": (lambda v: v >= 1, ">= 1"),
    "invalid_penalty": (lambda v: v >= 0, ">= 0"),
    "temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "max_new_tokens": (lambda v: v >= 1, ">= 1"),
}


def _require(ok: bool, key: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}. Fix it on the command line, e.g. {key}=...")


def _typed_group(cfg: DictConfig, name: str, schema: type) -> Any:
    node = cfg.get(name)
    if node is None:
        raise ConfigError(f"config group '{name}' is missing; choose one with {name}=<option>")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    except ConfigKeyError as err:
        bad = getattr(err, "key", None) or _first_quoted(str(err))
        allowed = ", ".join(f.name for f in fields(schema))
        raise ConfigError(f"unknown key {name}.{bad}; allowed keys of '{name}': {allowed}") from None
    except ValidationError as err:
        bad = getattr(err, "key", None) or _first_quoted(str(err))
        raise ConfigError(f"{name}.{bad} has the wrong type: {err.msg}") from None
    obj = OmegaConf.to_object(merged)
    obj.check()
    return obj


def _first_quoted(text: str) -> str:
    match = re.search(r"'([^']+)'", text)
    return match.group(1) if match else "?"


def _target_params(target: str, key: str) -> tuple[Any, inspect.Signature]:
    from hydra.utils import get_object

    try:
        obj = get_object(target)
    except Exception as err:  # hydra wraps import errors in its own types
        raise ConfigError(f"{key}._target_={target!r} cannot be imported: {err}") from None
    return obj, inspect.signature(obj)


def check_component(node: DictConfig | dict | None, key: str, runtime_kwargs: tuple[str, ...] = ()) -> None:
    """Check a ``_target_`` node: every key must be a parameter of the target; common ranges hold."""
    if node is None:
        raise ConfigError(f"{key} is missing; choose one with {key}=<option>")
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    target = data.get("_target_")
    if not target:
        raise ConfigError(f"{key} has no _target_; it must name the class or function that builds it")
    _, sig = _target_params(target, key)
    params = sig.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name, value in data.items():
        if name.startswith("_") and name.endswith("_"):
            continue
        if not takes_any and name not in params:
            allowed = ", ".join(p for p in params if p not in runtime_kwargs)
            raise ConfigError(f"unknown key {key}.{name} for {target}; allowed keys: {allowed}")
        if name in _COMMON_RANGES and isinstance(value, (int, float)) and not isinstance(value, bool):
            predicate, allowed_range = _COMMON_RANGES[name]
            _require(predicate(value), f"{key}.{name}", allowed_range, value)


def check_credit(node: DictConfig) -> None:
    """Construct the credit estimator: its constructor raises ``ValueError`` naming the parameter."""
    from hydra.utils import instantiate

    check_component(node, "credit")
    try:
        instantiate(node)
    except Exception as err:  # instantiate wraps the constructor's ValueError
        cause = err.__cause__ or err
        message = str(cause)
        match = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", message)
        name = match.group(1) if match and match.group(1) in node else None
        where = f"credit.{name}" if name else "credit"
        raise ConfigError(f"invalid {where}: {message}") from None


@dataclass
class ValidatedConfig:
    """The typed parts of a validated config, handed to the trainer."""

    trainer: TrainerConfig
    rollout: RolloutConfig


def validate_config(cfg: DictConfig) -> ValidatedConfig:
    """Validate the whole composed config; raise :class:`ConfigError` on the first problem."""
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS - {"hydra"})
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}"
        )
    if not isinstance(cfg.get("seed"), int) or cfg.seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {cfg.get('seed')!r}")
    trainer = _typed_group(cfg, "trainer", TrainerConfig)
    rollout = _typed_group(cfg, "rollout", RolloutConfig)
    check_credit(cfg.credit)
    check_component(cfg.env, "env")
    check_component(cfg.model, "model", runtime_kwargs=("suite", "device"))
    check_component(cfg.rollout.engine, "rollout.engine", runtime_kwargs=("policy",))
    check_component(cfg.logger, "logger", runtime_kwargs=("cfg",))
    return ValidatedConfig(trainer=trainer, rollout=rollout)
