"""The clipped-surrogate update of one iteration: PPO epochs of minibatches over the scored turns.

The advantage of a step is broadcast to its response tokens; the loss is a token-mean over the minibatch
(``progpo.algo.loss.ppo_loss``). Gradient accumulation over micro-batches keeps memory flat. On several ranks the
minibatches and the token-mean are those of one process (``minibatch_plan``, ``ppo_update``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from progpo import dist
from progpo.algo.loss import LossOutput, ppo_loss
from progpo.algo.scoring import (
    ScoredTurns,
    allowed_ids,
    first_of_each,
    micro_batches,
    sequence_length,
    turn_content,
)
from progpo.config import PPOConfig
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


@dataclass(frozen=True)
class Minibatch:
    """One optimizer step's share on this rank.

    ``steps``: this rank's turn indices, shortest first. ``tokens``: response tokens of the whole minibatch on all
    ranks (the token-mean's denominator). ``micro_batches``: forward/backward passes every rank runs for it, the
    most any rank needs; a rank with fewer steps runs empty ones, so that each takes part in every gradient
    reduction of the strategy.
    """

    steps: list[int]
    tokens: int
    micro_batches: int

    def chunks(self, size: int) -> list[list[int]]:
        """This rank's steps, ``size`` at a time, then empty chunks up to ``micro_batches``."""
        chunks = [self.steps[s : s + size] for s in range(0, len(self.steps), size)]
        return chunks + [[] for _ in range(self.micro_batches - len(chunks))]


def minibatch_plan(turns: list[Turn], trainable: list[int], cfg: PPOConfig, seed: int, iteration: int) -> list[Minibatch]:
    """The minibatches of every epoch, the same on any number of ranks.

    The trainable steps of all ranks are put in a canonical order, by (trajectory, step) with global ids. Identical
    turns (same prompt, response and allowed ids, compared by ``hash(turn_content)``; the N rollouts of a task often
    open alike) form one unit; the units are permuted by (seed, iteration, epoch) (``minibatch_order``), so a turn's
    copies land in one minibatch, where they share a forward pass (``_micro_batch_loss``). Each run of
    ``minibatch_size`` steps of that order is one minibatch, and a rank trains on its own steps in it, shortest
    first, copies side by side. So a minibatch of a 2-rank run is the union of the two ranks' parts, and holds
    exactly the steps of the 1-rank run's minibatch. Without copies this is a plain permutation of the steps.
    """
    me = dist.rank()
    content = {i: hash(turn_content(turns[i])) for i in trainable}
    rows = torch.tensor([[turns[i].traj, turns[i].t, len(turns[i].response_ids), me, i, content[i]] for i in trainable],
                        dtype=torch.long).reshape(-1, 6)
    rows = dist.gather_rows(rows)
    if len(rows):
        rows = rows[torch.argsort(rows[:, 0] * (int(rows[:, 1].max()) + 1) + rows[:, 1], stable=True)]
    unit_ids: dict[int, int] = {}
    unit = torch.tensor([unit_ids.setdefault(h, len(unit_ids)) for h in rows[:, 5].tolist()], dtype=torch.long)
    plan = []
    for epoch in range(cfg.epochs):
        place = torch.empty(len(unit_ids), dtype=torch.long)  # each unit's place in this epoch's permutation
        units_in_order = minibatch_order(list(range(len(unit_ids))), seed, iteration * cfg.epochs + epoch)
        place[torch.tensor(units_in_order, dtype=torch.long)] = torch.arange(len(unit_ids))
        order = torch.argsort(place[unit], stable=True)
        for start in range(0, len(order), cfg.minibatch_size):
            chunk = rows[order[start : start + cfg.minibatch_size]]
            per_rank = torch.bincount(chunk[:, 3], minlength=dist.world_size())
            mine = chunk[chunk[:, 3] == me, 4].tolist()
            plan.append(Minibatch(
                steps=sorted(mine, key=lambda i: (sequence_length(turns[i]), content[i])),
                tokens=int(chunk[:, 2].sum()),
                micro_batches=-(-int(per_rank.max()) // cfg.micro_batch_size),
            ))
    return plan


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
    no_sync: Callable[[], AbstractContextManager] = nullcontext,
) -> dict[str, float]:
    """Run ``cfg.epochs`` passes of minibatch updates; return the loss terms averaged over minibatches.

    ``backward`` is the trainer's backward (Lightning's ``manual_backward`` scales and syncs as its strategy
    needs); ``no_sync`` a context in which a backward does not reduce gradients across ranks (DDP's ``no_sync``),
    used for all but the last micro-batch of a minibatch. Every iteration returns the same keys: an update with
    nothing to train on reports 0 for each term.

    On several ranks (data parallel by task group, see ``progpo.dist``) the update is the single-process one:
    a minibatch is the same set of steps (``minibatch_plan``), each rank's loss is its token sum over the
    minibatch's token count on *all* ranks, and its backward is scaled by the world size, so the strategy's mean
    of the ranks' gradients is the gradient of the global token-mean. The loss terms returned are the global ones
    (sums over ranks); ``train/steps_updated`` counts the steps of all ranks.
    """
    device = next(actor.parameters()).device
    params = [p for p in actor.parameters() if p.requires_grad]
    trainable = updated_steps(turns, advantages, cfg.skip_zero_advantage)
    world = dist.world_size()
    representative = scored.representative if scored.representative is not None else first_of_each(turns)
    plan = minibatch_plan(turns, trainable, cfg, seed, iteration)
    sums = dict.fromkeys(LOSS_METRICS, 0.0)
    for minibatch in plan:
        optimizer.zero_grad(set_to_none=True)
        chunks = minibatch.chunks(cfg.micro_batch_size)
        for k, idx in enumerate(chunks):
            with no_sync() if k < len(chunks) - 1 else nullcontext():
                if not idx:  # this rank has no more steps in the minibatch: take part in the reduction with 0
                    backward(_zero_loss(actor, pad_token_id, device))
                    continue
                loss = _micro_batch_loss(actor, turns, idx, representative, scored, advantages, cfg, pad_token_id,
                                         device, minibatch.tokens)
                backward(loss.loss * world)
                for name in ("loss", "policy_loss", "kl", "clip_fraction", "approx_kl", "entropy"):
                    sums[name] += float(getattr(loss, name).detach())
        sums["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        optimizer.step()
    grad_norm = sums.pop("grad_norm")  # the same on every rank: the gradients are reduced before the norm
    totals = dist.sum_over_ranks({**sums, "steps_updated": float(len(trainable))})
    out = {LOSS_METRICS[k]: totals[k] / max(len(plan), 1) for k in sums}
    out[LOSS_METRICS["grad_norm"]] = grad_norm / max(len(plan), 1)
    out["train/steps_updated"] = totals["steps_updated"]
    return out


def _micro_batch_loss(actor, turns: list[Turn], idx: list[int], representative: list[int], scored: ScoredTurns,
                      advantages: torch.Tensor, cfg: PPOConfig, pad_token_id: int, device: torch.device,
                      tokens: int) -> LossOutput:
    """The clipped-surrogate loss of steps ``idx``: their token sums over ``tokens`` (the whole minibatch's).

    Identical turns (same prompt, response and allowed ids: the N rollouts of a task often open alike) have the
    same log-probs, so each distinct one goes through the model once and its rows are copied to its duplicates
    before the loss; their advantages still differ, and the backward through the copy sums their gradients, so
    the loss and its gradient are those of one forward per step.
    """
    distinct = list(dict.fromkeys(representative[i] for i in idx))
    slot = {turn: k for k, turn in enumerate(distinct)}
    rows = torch.tensor([slot[representative[i]] for i in idx], device=device)
    _, batch = next(micro_batches(turns, distinct, len(distinct), pad_token_id, device))
    out = forward_logprobs(actor, batch.input_ids, batch.attention_mask, batch.response_mask,
                           return_entropy=True, allowed=allowed_ids(turns, distinct))
    response_mask = batch.response_mask[rows]
    mask = response_mask.bool()
    ref = _scatter_rows(scored.ref_logprobs, idx, mask) if scored.ref_logprobs is not None else None
    return ppo_loss(
        out.token_logprobs[rows], _scatter_rows(scored.old_logprobs, idx, mask), ref,
        advantages[idx].to(device), response_mask,
        clip_ratio=cfg.clip_ratio, kl_coef=cfg.kl_coef if ref is not None else 0.0,
        entropy=out.entropy[rows], entropy_coef=cfg.entropy_coef, token_normalizer=float(tokens),
    )


def _zero_loss(actor: torch.nn.Module, pad_token_id: int, device: torch.device) -> torch.Tensor:
    """A loss of exactly 0 that reaches every parameter (a one-token forward): a rank's gradient share of 0."""
    ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
    return actor(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().sum() * 0.0


def _scatter_rows(values: list[torch.Tensor], idx: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Place each turn's per-response-token values at its response positions of the padded batch."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    flat = torch.cat([values[i] for i in idx]).to(mask.device)
    return out.masked_scatter(mask, flat)
