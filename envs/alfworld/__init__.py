"""ALFWorld on the real TextWorld engine: adapter, game discovery, offline game generator, Hydra suite."""

from envs.alfworld.env import AlfWorldEnv, AlfWorldEnvFactory, normalize_command
from envs.alfworld.games import find_games
from envs.alfworld.generate import TASK_LABELS, TASK_TYPES, generate
from envs.alfworld.suite import make_suite

__all__ = [
    "TASK_LABELS",
    "TASK_TYPES",
    "AlfWorldEnv",
    "AlfWorldEnvFactory",
    "find_games",
    "generate",
    "make_suite",
    "normalize_command",
]
