"""The clipped-surrogate update of one iteration: PPO epochs of minibatches over the scored turns.

The advantage of a step is broadcast to its response tokens; the loss is a token-mean over the minibatch
(``progpo.loss.ppo_loss``). Gradient accumulation over micro-batches keeps memory flat.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from progpo.algo.scoring import ScoredTurns, allowed_ids, micro_batches, sequence_length
from progpo.config import PPOConfig
from progpo.loss import ppo_loss
from progpo.models.logprobs import forward_logprobs
from progpo.types import Turn

LOSS_METRICS = {"loss": "loss/total", "policy_loss": "loss/policy", "kl": "loss/kl",
                "clip_fraction": "loss/clip_fraction", "approx_kl": "loss/approx_kl", "entropy": "loss/entropy",
                "grad_norm": "loss/grad_norm"}


def updated_steps(turns: list[Turn], advantages: torch.Tensor, skip_zero_advantage: bool) -> list[int]:
    """Steps the update trains on: those with a response, and, with ``skip_zero_advantage``, a non-zero advantage.

    A step whose advantage is exactly 0 (e.g. every rollout of its task failed) has no policy gradient; leaving
    it out saves its forward/backward, and KL and entropy then act on the updated steps.
    """
    trainable = [i for i, t in enumerate(turns) if len(t.response_ids) > 0]
    if skip_zero_advantage:
        nonzero = (advantages != 0).tolist()
        trainable = [i for i in trainable if nonzero[i]]
    return trainable


def minibatch_order(steps: list[int], seed: int, iteration: int) -> list[int]:
    """A permutation of ``steps`` that depends on (seed, iteration) only, so a resumed run updates alike."""
    state = int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(state)
    return [steps[i] for i in torch.randperm(len(steps), generator=generator).tolist()]


def ppo_update(
    actor: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    backward: Callable[[torch.Tensor], None],
    turns: list[Turn],
    scored: ScoredTurns,
    advantages: torch.Tensor,
    cfg: PPOConfig,
    pad_token_id: int,
    seed: int = 0,
    iteration: int = 0,
) -> dict[str, float]:
    """Run ``cfg.epochs`` passes of minibatch updates; return the loss terms averaged over minibatches.

    ``backward`` is the trainer's backward (Lightning's ``manual_backward`` scales and syncs as its strategy
    needs). Every iteration returns the same keys: an update with nothing to train on reports 0 for each term.
    """
    device = next(actor.parameters()).device
    params = [p for p in actor.parameters() if p.requires_grad]
    trainable = updated_steps(turns, advantages, cfg.skip_zero_advantage)
    sums = dict.fromkeys(LOSS_METRICS, 0.0)
    n_minibatches = 0
    for epoch in range(cfg.epochs):
        order = minibatch_order(trainable, seed, iteration * cfg.epochs + epoch)
        for start in range(0, len(order), cfg.minibatch_size):
            minibatch = sorted(order[start : start + cfg.minibatch_size], key=lambda i: sequence_length(turns[i]))
            n_tokens = float(sum(len(turns[i].response_ids) for i in minibatch))
            optimizer.zero_grad(set_to_none=True)
            for idx, tokens in micro_batches(turns, minibatch, cfg.micro_batch_size, pad_token_id, device):
                mask = tokens.response_mask.bool()
                ref = _scatter_rows(scored.ref_logprobs, idx, mask) if scored.ref_logprobs is not None else None
                out = forward_logprobs(actor, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                                       return_entropy=True, allowed=allowed_ids(turns, idx))
                loss = ppo_loss(
                    out.token_logprobs, _scatter_rows(scored.old_logprobs, idx, mask), ref,
                    advantages[idx].to(device), tokens.response_mask,
                    clip_ratio=cfg.clip_ratio, kl_coef=cfg.kl_coef if ref is not None else 0.0,
                    entropy=out.entropy, entropy_coef=cfg.entropy_coef, token_normalizer=n_tokens,
                )
                backward(loss.loss)
                for name in ("loss", "policy_loss", "kl", "clip_fraction", "approx_kl", "entropy"):
                    sums[name] += float(getattr(loss, name).detach())
            sums["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            optimizer.step()
            n_minibatches += 1
    out = {LOSS_METRICS[k]: v / max(n_minibatches, 1) for k, v in sums.items()}
    out["train/steps_updated"] = float(len(trainable))
    return out


def _scatter_rows(values: list[torch.Tensor], idx: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Place each turn's per-response-token values at its response positions of the padded batch."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    flat = torch.cat([values[i] for i in idx]).to(mask.device)
    return out.masked_scatter(mask, flat)
