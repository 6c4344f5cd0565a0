"""Score one iteration's turns with the weights that sampled them: old log-probs, reference log-probs, and the
last-prompt-token hidden state (the semantic embedding the credit estimators group states by).

One no-grad pass of the reference per micro-batch, and one of the actor unless the engine already computed the
actor's values while sampling (HF engine at temperature 1: ``Turn.actor_scored``). Identical turns are scored once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from progpo.models.logprobs import TokenBatch, forward_logprobs, pad_prompt_response
from progpo.types import Turn


@dataclass
class ScoredTurns:
    """Per-turn tensors of one iteration, in the order of ``RolloutBatch.turns``."""

    old_logprobs: list[torch.Tensor]  # each [len(response)]
    ref_logprobs: list[torch.Tensor | None] | None  # None without a reference (ppo.kl_coef = 0); per turn, None for
    # a turn the update does not train on (``reference_logprobs``)
    embeddings: torch.Tensor  # [n, d]
    representative: list[int] | None = None  # ``first_of_each(turns)``, kept so later passes need not redo it


def micro_batches(
    turns: list[Turn], indices: list[int], size: int, pad_token_id: int, device: torch.device
) -> Iterator[tuple[list[int], TokenBatch]]:
    """``indices`` in chunks of ``size``, each as one right-padded prompt+response batch."""
    for start in range(0, len(indices), size):
        idx = indices[start : start + size]
        tokens = pad_prompt_response(
            [turns[i].prompt_ids for i in idx], [turns[i].response_ids for i in idx], pad_token_id, device=device
        )
        yield idx, tokens


def allowed_ids(turns: list[Turn], idx: list[int]) -> list[list[list[int]] | None] | None:
    """Per-position allowed ids of constrained turns (log-probs of the policy that acted); None if all free."""
    rows = [turns[i].allowed_token_ids for i in idx]
    return rows if any(r is not None for r in rows) else None


def sequence_length(turn: Turn) -> int:
    return len(turn.prompt_ids) + len(turn.response_ids)


def turn_content(turn: Turn) -> tuple:
    """What a turn's log-probs depend on: prompt, response and allowed ids (a free position or row: ``()``,
    unambiguous since a constrained position allows at least one id). Ints only, so ``hash`` of it is the same in
    every process (the update's minibatch plan compares turns across ranks by it)."""
    allowed = (tuple(tuple(a) if a is not None else () for a in turn.allowed_token_ids)
               if turn.allowed_token_ids is not None else ())
    return tuple(turn.prompt_ids), tuple(turn.response_ids), allowed


def first_of_each(turns: list[Turn]) -> list[int]:
    """For every turn, the index of the first turn with the same prompt, response and allowed ids."""
    first: dict[tuple, int] = {}
    return [first.setdefault(turn_content(t), i) for i, t in enumerate(turns)]


@torch.no_grad()
def score_turns(
    actor: torch.nn.Module,
    reference: torch.nn.Module | None,
    turns: list[Turn],
    pad_token_id: int,
    micro_batch_size: int,
    recompute_old: bool = False,
) -> ScoredTurns:
    """Old and reference log-probs of every response token, and the last-prompt-token embedding.

    A turn the engine scored with the actor itself (``Turn.actor_scored``) keeps its sampling log-probs as old
    log-probs and its prefill embedding, unless ``recompute_old``; the others get a no-grad actor pass.
    Identical turns (same prompt, response and allowed ids: the N rollouts' shared first step, or a policy
    going round a loop, which with a K-step history shows the same prompt again) are scored once and shared.
    Rows are scored shortest first, so a micro-batch pads little.
    """
    device = next(actor.parameters()).device
    representative = first_of_each(turns)
    order = sorted(set(representative), key=lambda i: sequence_length(turns[i]))
    old: list[torch.Tensor | None] = [None] * len(turns)
    embeddings: list[torch.Tensor | None] = [None] * len(turns)
    was_training = actor.training
    actor.eval()
    reused = [] if recompute_old else [i for i in order if turns[i].actor_scored]
    for i in reused:
        old[i] = torch.tensor(turns[i].sample_logprobs, dtype=torch.float32)
        embeddings[i] = turns[i].prompt_hidden.float()
    to_score = [i for i in order if old[i] is None]  # the actor pass; the reference scores every turn
    try:
        for idx, tokens in micro_batches(turns, to_score, micro_batch_size, pad_token_id, device):
            out = forward_logprobs(actor, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                                   return_last_prompt_hidden=True, allowed=allowed_ids(turns, idx))
            mask = tokens.response_mask.bool()
            for row, i in enumerate(idx):
                old[i] = out.token_logprobs[row][mask[row]].float()
                embeddings[i] = out.last_prompt_hidden[row].float()
    finally:
        actor.train(was_training)
    for i, rep in enumerate(representative):
        old[i], embeddings[i] = old[rep], embeddings[rep]
    return ScoredTurns(
        old_logprobs=old,  # type: ignore[arg-type]
        ref_logprobs=reference_logprobs(reference, turns, range(len(turns)), pad_token_id, micro_batch_size,
                                        representative) if reference is not None else None,
        embeddings=torch.stack(embeddings),  # type: ignore[arg-type]
        representative=representative,
    )


@torch.no_grad()
def reference_logprobs(
    reference: torch.nn.Module,
    turns: list[Turn],
    steps: Iterable[int],
    pad_token_id: int,
    micro_batch_size: int,
    representative: list[int] | None = None,
) -> list[torch.Tensor | None]:
    """The frozen reference's log-probs of the response tokens of ``steps`` (None for the other turns).

    Only the update's KL needs them, so the iteration asks for the steps it trains on once the credit is known
    (with ``ppo.skip_zero_advantage`` 20-50% fewer). Identical turns are scored once, shortest first;
    ``representative`` is ``first_of_each(turns)`` when the caller has it (``ScoredTurns.representative``).
    """
    device = next(reference.parameters()).device
    if representative is None:
        representative = first_of_each(turns)
    wanted = set(steps)
    order = sorted({representative[i] for i in wanted}, key=lambda i: sequence_length(turns[i]))
    ref: list[torch.Tensor | None] = [None] * len(turns)
    for idx, tokens in micro_batches(turns, order, micro_batch_size, pad_token_id, device):
        out = forward_logprobs(reference, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                               allowed=allowed_ids(turns, idx))
        mask = tokens.response_mask.bool()
        for row, i in enumerate(idx):
            ref[i] = out.token_logprobs[row][mask[row]].float()
    return [ref[representative[i]] if i in wanted else None for i in range(len(turns))]


def pad_token_id(tokenizer) -> int:
    """The id that pads scoring batches: the tokenizer's pad token, else its eos token."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set one in the model builder")
    return int(pad)
