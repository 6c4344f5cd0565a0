"""What one iteration logs: episode outcomes, credit diagnostics, the sampler/trainer mismatch, throughput."""

from __future__ import annotations

import numpy as np
import torch

from progpo.credit import CreditResult
from progpo.types import RolloutBatch, Turn


def sampler_mismatch(turns: list[Turn], old_logprobs: list[torch.Tensor]) -> dict[str, float]:
    """The engine's sampling log-probs against the trainer's old log-probs on the same tokens.

    ``rollout/logprob_diff_mean`` / ``_max``: mean and max of ``|log p_sampler - log p_trainer|`` over response
    tokens; ``rollout/sampler_kl``: the k3 estimate of KL(sampler || trainer) on the sampled tokens. About 0 when
    the engine generates with the actor (HF), small for a synced vLLM (other kernels), large for an engine whose
    weights are stale. Sampling at a temperature other than 1 shows up here too (old log-probs are at T=1).
    """
    sampled = [torch.tensor(t.sample_logprobs, dtype=torch.float32) for t in turns if t.response_ids]
    trained = [old.float().cpu() for t, old in zip(turns, old_logprobs) if t.response_ids]
    if not sampled:
        return {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/sampler_kl": 0.0}
    sample, old = torch.cat(sampled), torch.cat(trained)
    diff = (sample - old).abs()
    log_ratio = (old - sample).clamp(-20.0, 20.0)  # log p_trainer / p_sampler on tokens drawn from the sampler
    return {
        "rollout/logprob_diff_mean": float(diff.mean()),
        "rollout/logprob_diff_max": float(diff.max()),
        "rollout/sampler_kl": max(float((torch.expm1(log_ratio) - log_ratio).mean()), 0.0),  # >= 0 up to round-off
    }


def iteration_metrics(
    batch: RolloutBatch,
    credit: CreditResult,
    advantages: torch.Tensor,
    update: dict[str, float],
    mismatch: dict[str, float],
    seconds: dict[str, float],
) -> dict[str, float]:
    """All metrics of one training iteration, by CleanRL-style stable names."""
    turns = batch.turns
    rollout_s = max(batch.rollout_seconds, 1e-9)
    return {
        **batch.metrics("train"),
        **{f"credit/{k}": float(v) for k, v in credit.stats.items()},
        **update,
        **mismatch,
        "train/advantage_abs_mean": float(advantages.abs().mean()) if len(advantages) else 0.0,
        "train/steps": float(len(turns)),
        "perf/rollout_s": batch.rollout_seconds,
        **{f"perf/{phase}_s": value for phase, value in seconds.items()},
        "perf/env_steps_per_s": batch.env_steps / rollout_s,
        "perf/tokens_per_s": batch.generated_tokens / rollout_s,
        "perf/prompt_truncated": float(np.mean([t.prompt_truncated for t in turns])) if turns else 0.0,
    }
