"""Start-up validation of the composed Hydra config.

Every run goes through :func:`validate_config` before any model or environment is built, so that a typo or an
out-of-range value fails in a second with a message naming the key and the allowed range, not twenty minutes
into a run. Plain groups (``trainer``, ``ppo``, ``eval``, ``schedule``, ``rollout``) are typed dataclasses;
``_target_`` components (``credit``, ``env``, ``model``, ``rollout.engine``, ``optim``, ``logger``) are checked
against the signature of their target, and the credit estimator is constructed (it is cheap and pure) so that its
own range checks run.
"""

from __future__ import annotations

import inspect
import re
import typing
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from progpo.config.groups import TYPED_GROUPS, ConfigError, RunConfig, WarmStartConfig, require
from progpo.hardware import is_batch_rows

TOP_LEVEL_KEYS = {
    "env", "model", "credit", "rollout", "optim", "ppo", "eval", "schedule", "trainer", "logger", "seed",
    "objective", "resume", "ckpt_path", "run_name", "run_dir", "ablation", "torch_threads", "warm_start",
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
    "lr": (lambda v: v > 0, "> 0"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
}


def _typed_group(cfg: DictConfig, name: str, schema: type) -> Any:
    node = cfg.get(name)
    if node is None:
        raise ConfigError(f"config group '{name}' is missing; choose one with {name}=<option>")
    try:
        # resolved first: interpolations such as ${seed} point at the run config, not at this detached group
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(node, resolve=True))
    except ConfigKeyError as err:
        bad = getattr(err, "key", None) or _first_quoted(str(err))
        allowed = ", ".join(f.name for f in fields(schema))
        raise ConfigError(f"unknown key {name}.{bad}; allowed keys of '{name}': {allowed}") from None
    except ValidationError as err:
        bad = getattr(err, "key", None) or _first_quoted(str(err))
        raise ConfigError(f"{name}.{bad} has the wrong type: {err.msg}") from None
    try:
        obj = OmegaConf.to_object(merged)
        obj.check()
    except ValueError as err:  # a dataclass that checks itself on construction (warm_start) raises ValueError
        raise ConfigError(str(err)) from None
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
    obj, sig = _target_params(target, key)
    params = sig.parameters
    choices = _literal_choices(obj)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name, value in data.items():
        if name.startswith("_") and name.endswith("_"):
            continue
        if not takes_any and name not in params:
            allowed = ", ".join(p for p in params if p not in runtime_kwargs)
            raise ConfigError(f"unknown key {key}.{name} for {target}; allowed keys: {allowed}")
        if name in _COMMON_RANGES and isinstance(value, (int, float)) and not isinstance(value, bool):
            predicate, allowed_range = _COMMON_RANGES[name]
            require(predicate(value), f"{key}.{name}", allowed_range, value)
        if name in choices:
            require(value in choices[name], f"{key}.{name}", f"one of {', '.join(map(str, choices[name]))}", value)


def _literal_choices(obj: Any) -> dict[str, tuple[Any, ...]]:
    """Parameters of ``obj`` annotated ``Literal[...]`` and their allowed values (checked before building)."""
    try:
        hints = typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj)
    except Exception:  # unresolvable annotations: nothing to check here, the target checks its own values
        return {}
    return {name: typing.get_args(h) for name, h in hints.items() if typing.get_origin(h) is typing.Literal}


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


def preflight_model(node: DictConfig) -> None:
    """Call the model builder's ``preflight`` hook, if it has one, with the model's keys (e.g. ``build_hf``:
    are the weights on disk or reachable?); a missing file becomes a :class:`ConfigError` naming the field to set
    (exit code 2). Not part of ``validate_config`` (a config is valid on a machine without the weights); ``train``
    runs it right after."""
    target, _ = _target_params(node._target_, "model")
    hook = getattr(target, "preflight", None)
    if hook is not None:
        try:
            hook(**{k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")})
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None


def validate_config(cfg: DictConfig) -> RunConfig:
    """Validate the whole composed config; raise :class:`ConfigError` on the first problem."""
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS - {"hydra"})
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}"
        )
    if not isinstance(cfg.get("seed"), int) or cfg.seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {cfg.get('seed')!r}")
    threads = cfg.get("torch_threads")
    if threads is not None:
        require(isinstance(threads, int) and threads >= 1, "torch_threads", "an integer >= 1 or null", threads)
    typed = {name: _typed_group(cfg, name, schema) for name, schema in TYPED_GROUPS.items()}
    world = typed["trainer"].world_size
    require(typed["rollout"].tasks_per_batch >= world, "rollout.tasks_per_batch",
            f">= the world size {world} (every rank plays whole tasks)", typed["rollout"].tasks_per_batch)
    check_credit(cfg.credit)
    _typed_group(cfg, "warm_start", WarmStartConfig)  # checked for every model, read by model=tiny only
    check_component(cfg.env, "env")
    check_component(cfg.model, "model", runtime_kwargs=("suite", "device"))
    check_component(cfg.rollout.engine, "rollout.engine", runtime_kwargs=("policy",))
    if "batch_size" in cfg.rollout.engine:
        require(is_batch_rows(cfg.rollout.engine.batch_size), "rollout.engine.batch_size", "an int >= 1 or auto",
                cfg.rollout.engine.batch_size)
    check_component(cfg.optim, "optim", runtime_kwargs=("params",))
    check_component(cfg.logger, "logger", runtime_kwargs=("cfg",))
    return RunConfig(**typed, torch_threads=threads)
