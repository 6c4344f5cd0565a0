"""The data every layer passes around: a policy, one agent turn, one episode, one rollout batch.

A leaf module (it imports nothing of ours), so that ``models/``, ``rollout/``, ``warmstart/`` and ``algo/`` can
all depend on it without depending on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Policy:
    """A causal LM and its tokenizer, as built by a ``conf/model/*.yaml`` component.

    ``source`` is where the weights can be loaded from again (a local folder or a hub id): vLLM starts
    from it and then receives the actor's current weights through ``Engine.sync_weights``.
    """

    model: Any  # transformers PreTrainedModel (or a peft model wrapping one)
    tokenizer: Any  # transformers tokenizer with a chat template, left padding and a pad token
    name: str
    max_context: int  # longest prompt + response, in tokens, the policy is used with
    source: str
    prompt_style: str = "paper"  # progpo.rollout.prompt.PROMPT_STYLES key the policy was trained with
    constrain_to_admissible: bool = False  # decode only admissible commands (engines follow this unless told)


@dataclass
class Turn:
    """One agent step: what the model saw and said, and what the env answered."""

    traj: int
    group: int
    t: int
    prompt_ids: list[int]
    response_ids: list[int]
    sample_logprobs: list[float]  # the engine's log-prob of each response token when it sampled it
    obs_id: int  # id of the observation the agent acted on (the credit estimators' state)
    response_text: str
    action: str
    valid: bool
    reward: float
    prompt_truncated: bool = False
    # Constrained decoding: the token ids allowed at each response position (None: decoded freely; a None
    # position inside a list is a free one, e.g. reasoning before a constrained <action>).
    allowed_token_ids: list[list[int] | None] | None = None
    # Set when the engine generated with the actor at temperature 1 (HF engine): ``sample_logprobs`` are then the
    # old log-probs and ``prompt_hidden`` ([d] final hidden state of the last prompt token, captured in the
    # prefill) the state embedding, so scoring need not recompute either (``ppo.recompute_old_logprobs``).
    prompt_hidden: Any = None  # torch.Tensor [d] float32, or None

    @property
    def actor_scored(self) -> bool:
        return self.prompt_hidden is not None


@dataclass
class Episode:
    """Outcome of one trajectory. ``error`` is set when an env worker fault ended it (``train/env_errors``)."""

    traj: int
    group: int
    task: Any  # envs.base.Task
    won: bool
    length: int
    n_invalid: int
    error: str | None = None
    score: float | None = None  # the env's task score at the end (WebShop's purchase score), None if it has none
    # The env's own numbers for the episode (``StepInfo.extra["episode_metrics"]``, e.g. WebShop's purchase parts:
    # which parts of a purchase missed is what tells why success is low)
    env_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutBatch:
    """One batch of rollouts: every turn, every episode, plus throughput numbers."""

    turns: list[Turn]
    episodes: list[Episode]
    rollout_seconds: float
    generated_tokens: int
    env_steps: int

    def metrics(self, prefix: str) -> dict[str, float]:
        """Success overall and per task type, episode length, invalid-action rate, env faults."""
        return episode_metrics(self.episodes, prefix)


def episode_metrics(episodes: Sequence[Episode], prefix: str) -> dict[str, float]:
    """``<prefix>/success`` (and per task type), ``episode_length``, ``invalid_rate``, ``env_errors``, ``score``
    (mean task score, e.g. WebShop's) when the env reports one, and each of the env's own episode metrics (mean over
    the episodes that report it)."""
    if not episodes:
        return {}
    won = np.array([e.won for e in episodes], dtype=np.float64)
    lengths = np.array([e.length for e in episodes], dtype=np.float64)
    invalid = np.array([e.n_invalid for e in episodes], dtype=np.float64)
    out = {
        f"{prefix}/success": float(won.mean()),
        f"{prefix}/episode_length": float(lengths.mean()),
        f"{prefix}/invalid_rate": float(invalid.sum() / max(lengths.sum(), 1.0)),
        f"{prefix}/env_errors": float(sum(e.error is not None for e in episodes)),
    }
    scores = [e.score for e in episodes if e.score is not None]
    if scores:
        out[f"{prefix}/score"] = float(np.mean(scores))
    for name in sorted({k for e in episodes for k in e.env_metrics}):  # each over the episodes that report it
        out[f"{prefix}/{name}"] = float(np.mean([e.env_metrics[name] for e in episodes if name in e.env_metrics]))
    for task_type in sorted({e.task.task_type for e in episodes}):
        mask = np.array([e.task.task_type == task_type for e in episodes])
        out[f"{prefix}/success/{task_type}"] = float(won[mask].mean())
    return out
