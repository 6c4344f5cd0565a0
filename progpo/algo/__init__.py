"""The RL algorithm without Lightning: scoring, the PPO update, and one iteration that ties them together.

Read ``iteration.py`` first: it is the whole data flow of one iteration in one screen.
"""

from progpo.algo.iteration import EvalResult, IterationResult, IterationTasks, RLIteration, step_batch
from progpo.algo.ppo import ppo_update
from progpo.algo.scoring import ScoredTurns, score_turns

__all__ = [
    "EvalResult",
    "IterationResult",
    "IterationTasks",
    "RLIteration",
    "ScoredTurns",
    "ppo_update",
    "score_turns",
    "step_batch",
]
