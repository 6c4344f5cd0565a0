"""What one iteration logs: episode outcomes, credit diagnostics, the sampler/trainer mismatch, throughput.

Every metric is over all ranks (``progpo.dist``): counts and sums are reduced, then divided, so a fraction is a
fraction of all steps, not a mean of the ranks' fractions.
"""

from __future__ import annotations

import torch

from progpo import dist
from progpo.credit import CreditResult
from progpo.types import RolloutBatch, Turn, episode_metrics


def sampler_mismatch(turns: list[Turn], old_logprobs: list[torch.Tensor]) -> dict[str, float]:
    """The engine's sampling log-probs against the trainer's old log-probs on the same tokens (all ranks' tokens).

    ``rollout/logprob_diff_mean`` / ``_max``: mean and max of ``|log p_sampler - log p_trainer|`` over response
    tokens; ``rollout/sampler_kl``: the k3 estimate of KL(sampler || trainer) on the sampled tokens. About 0 when
    the engine generates with the actor (HF), small for a synced vLLM (other kernels), large for an engine whose
    weights are stale. Sampling at a temperature other than 1 shows up here too (old log-probs are at T=1).
    """
    sampled = [torch.tensor(t.sample_logprobs, dtype=torch.float64) for t in turns if t.response_ids]
    trained = [old.double().cpu() for t, old in zip(turns, old_logprobs) if t.response_ids]
    sums = {"tokens": 0.0, "diff": 0.0, "k3": 0.0}
    largest = {"diff": 0.0}
    if sampled:
        sample, old = torch.cat(sampled), torch.cat(trained)
        diff = (sample - old).abs()
        log_ratio = (old - sample).clamp(-20.0, 20.0)  # log p_trainer / p_sampler on tokens drawn from the sampler
        sums = {"tokens": float(len(diff)), "diff": float(diff.sum()),
                "k3": float((torch.expm1(log_ratio) - log_ratio).sum())}
        largest = {"diff": float(diff.max())}
    sums, largest = dist.sum_over_ranks(sums), dist.max_over_ranks(largest)
    tokens = max(sums["tokens"], 1.0)
    return {
        "rollout/logprob_diff_mean": sums["diff"] / tokens,
        "rollout/logprob_diff_max": largest["diff"],
        "rollout/sampler_kl": max(sums["k3"] / tokens, 0.0),  # >= 0 up to round-off
    }


def batch_episode_metrics(batch: RolloutBatch, prefix: str) -> dict[str, float]:
    """``RolloutBatch.metrics`` over the episodes of all ranks (in trajectory order, as one process has them)."""
    episodes = sorted(dist.gather_objects(batch.episodes), key=lambda e: e.traj)
    return episode_metrics(episodes, prefix)


def iteration_metrics(
    batch: RolloutBatch,
    credit: CreditResult,
    advantages: torch.Tensor,
    update: dict[str, float],
    mismatch: dict[str, float],
    seconds: dict[str, float],
) -> dict[str, float]:
    """All metrics of one training iteration, by CleanRL-style stable names, over all ranks.

    Means and fractions are over the steps or episodes of all ranks (a 2-rank run logs what one process logs on
    the same rollouts); times are the slowest rank's; throughputs are all ranks' work over that time.
    """
    turns = batch.turns
    totals = dist.sum_over_ranks({
        "steps": float(len(turns)),
        "advantage_abs": float(advantages.double().abs().sum()),
        "prompt_truncated": float(sum(t.prompt_truncated for t in turns)),
        "env_steps": float(batch.env_steps),
        "generated_tokens": float(batch.generated_tokens),
    })
    slowest = dist.max_over_ranks({"rollout": batch.rollout_seconds, **seconds})
    rollout_s = max(slowest["rollout"], 1e-9)
    steps = max(totals["steps"], 1.0)
    return {
        **batch_episode_metrics(batch, "train"),
        **{f"credit/{k}": float(v) for k, v in credit.stats.items()},
        **update,
        **mismatch,
        "train/advantage_abs_mean": totals["advantage_abs"] / steps,
        "train/steps": totals["steps"],
        "perf/rollout_s": slowest["rollout"],
        **{f"perf/{phase}_s": slowest[phase] for phase in seconds},
        "perf/env_steps_per_s": totals["env_steps"] / rollout_s,
        "perf/tokens_per_s": totals["generated_tokens"] / rollout_s,
        "perf/prompt_truncated": totals["prompt_truncated"] / steps,
    }
