"""The run's configuration: typed groups (``groups.py``) and the start-up validation (``validate.py``)."""

from pathlib import Path

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

# The Hydra config tree `python -m progpo.train` composes; benchmarks, sweeps and measurements compose from it too.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

__all__ = [
    "CONF_DIR",
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
