"""The run's configuration: typed groups (``groups.py``) and the start-up validation (``validate.py``)."""

from progpo.config.groups import (
    ConfigError,
    EvalConfig,
    PPOConfig,
    RolloutConfig,
    RunConfig,
    ScheduleConfig,
    TrainerConfig,
    WarmStartConfig,
    world_size_mismatch,
)
from progpo.config.validate import check_component, check_credit, preflight_model, validate_config

__all__ = [
    "ConfigError",
    "EvalConfig",
    "PPOConfig",
    "RolloutConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "check_component",
    "check_credit",
    "preflight_model",
    "validate_config",
    "world_size_mismatch",
]
