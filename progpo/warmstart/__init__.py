"""The supervised warm start: expert demos, SFT, and the ``model=tiny`` builder that uses them.

Above ``models/`` and ``rollout/`` (it builds prompts as RL does and trains a model), below ``algo/``.
"""

from progpo.config.groups import WarmStartConfig
from progpo.warmstart.demos import DemoStats, DemoStep, collect_demos, collect_focus_demos, response_text
from progpo.warmstart.sft import length_bucketed_batches, supervised_finetune

__all__ = [
    "DemoStats",
    "DemoStep",
    "WarmStartConfig",
    "collect_demos",
    "collect_focus_demos",
    "length_bucketed_batches",
    "response_text",
    "supervised_finetune",
]
