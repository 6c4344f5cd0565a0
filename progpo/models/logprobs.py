"""Teacher-forced log-probs of response tokens, and the batch layout they are computed on.

Only the positions that predict response tokens go through the LM head, so the [B, L, V] logits tensor
is never built (Qwen's vocabulary is 151k: that tensor would dominate memory). The same pass returns the
last prompt token's final hidden state: the semantic embedding the credit estimators group states by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from progpo.masks import allowed_mask
from progpo.models.shapes import WINDOW_MULTIPLE, pad_batch, pad_head_rows, padding_active
from progpo.models.window import supports_window, window_hidden, window_positions


@dataclass
class TokenBatch:
    """Right-padded prompt+response rows: prompt first, then response, then padding."""

    input_ids: Tensor  # [B, L] long
    attention_mask: Tensor  # [B, L] long, 1 on prompt and response tokens
    response_mask: Tensor  # [B, L] long, 1 on response tokens only


@dataclass
class LogProbOutput:
    """``token_logprobs[b, t]`` is log p(input_ids[b, t] | input_ids[b, :t]) on response tokens, 0 elsewhere."""

    token_logprobs: Tensor  # [B, L] float32
    entropy: Tensor | None  # [B, L] float32 entropy of the predictive distribution at response tokens
    last_prompt_hidden: Tensor | None  # [B, d] final-layer hidden state of the last prompt token (detached)


def pad_prompt_response(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device | str | None = None,
) -> TokenBatch:
    """Concatenate each prompt with its response and right-pad the rows into one batch."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
    if not prompts:
        raise ValueError("pad_prompt_response needs at least one row")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the response is predicted from it)")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    n = len(prompts)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row = list(p) + list(r)
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
        response_mask[i, len(p) : len(row)] = 1
    return TokenBatch(
        input_ids=input_ids.to(device) if device is not None else input_ids,
        attention_mask=attention_mask.to(device) if device is not None else attention_mask,
        response_mask=response_mask.to(device) if device is not None else response_mask,
    )


def _head_logprobs(
    head: torch.nn.Module,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    with_entropy: bool,
    allowed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -torch.inf)
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        # Masked ids have p = 0 and log p = -inf: zero the log first, or 0 * -inf is NaN (and so is its gradient).
        safe = logp_all.masked_fill(~allowed, 0.0) if allowed is not None else logp_all
        entropy = -(logp_all.exp() * safe).sum(-1)
    else:
        entropy = logp.new_zeros(logp.shape)
    return logp, entropy


def _allowed_rows(
    allowed: Sequence[Sequence[Sequence[int]] | None], response_mask: Tensor, targets: Tensor, vocab: int
) -> Tensor | None:
    """[N, V] mask over the flattened response positions (row-major, as ``h`` is gathered); None if all free."""
    counts = response_mask.sum(dim=1).tolist()
    if len(allowed) != len(counts):
        raise ValueError(f"allowed has {len(allowed)} rows but the batch has {len(counts)}")
    if all(a is None for a in allowed):
        return None
    flat: list[Sequence[int] | None] = []
    for row, (ids, n) in enumerate(zip(allowed, counts)):
        if ids is not None and len(ids) != n:
            raise ValueError(f"allowed[{row}] has {len(ids)} positions but the row has {n} response tokens")
        flat.extend(ids if ids is not None else [None] * n)
    mask = allowed_mask(flat, vocab)
    if not bool(mask.gather(1, targets.cpu().unsqueeze(1)).all()):
        raise ValueError("a response token is not among the allowed ids of its position")
    return mask


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    return_last_prompt_hidden: bool = False,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int = 2048,
    allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
) -> LogProbOutput:
    """One forward pass: log-probs of the response tokens (and optionally entropy and the prompt embedding).

    Args:
        model: a transformers causal LM (``get_decoder()`` + ``get_output_embeddings()``; peft models work).
        input_ids, attention_mask, response_mask: [B, L], e.g. from ``pad_prompt_response``; a row's prompt
            tokens are the attended tokens outside ``response_mask``.
        return_last_prompt_hidden: also return the final hidden state of each row's last prompt token.
        temperature: divide the logits by this before the softmax (match the sampling temperature to compare
            with an engine's sampling log-probs; training uses 1.0).
        return_entropy: also return the per-token entropy (costs one extra [N, V] product per chunk).
        chunk_size: response tokens per LM-head call; under autograd each chunk is recomputed in backward
            instead of keeping its [chunk, V] log-softmax alive.
        allowed: per row, the token ids allowed at each of its response positions (constrained decoding,
            ``Turn.allowed_token_ids``) or None for a free row: log-probs and entropy are then those of the
            distribution renormalised over the allowed ids, i.e. of the policy that actually acted.
    """
    _check_batch(input_ids, attention_mask, response_mask, temperature)
    rows, columns = input_ids.shape
    padded = padding_active(input_ids.device)  # a few shapes for oneDNN's kernels (progpo.models.shapes)
    if padded:
        input_ids, attention_mask, response_mask, allowed = pad_batch(input_ids, attention_mask, response_mask, allowed)
    batch, length = input_ids.shape
    window = _response_window(model, attention_mask, response_mask, WINDOW_MULTIPLE if padded else 1)
    if window is not None:  # the last layer runs at the window only (progpo.models.window)
        positions, predicts = window
        hidden = window_hidden(model, input_ids, positions)
        h = hidden[predicts]
        targets = input_ids.gather(1, (positions + 1).clamp(max=length - 1))[predicts]
    else:
        hidden = _final_hidden(model, input_ids, attention_mask)
        predicts = response_mask[:, 1:].bool()  # hidden state at t-1 predicts the token at t
        h = hidden[:, :-1][predicts]
        targets = input_ids[:, 1:][predicts]
    head = model.get_output_embeddings()
    mask = _allowed_rows(allowed, response_mask, targets, head.weight.shape[0]) if allowed is not None else None
    n_targets = h.shape[0]
    if padded:
        h, targets, mask = pad_head_rows(h, targets, mask)

    logps, entropies = [], []
    for start in range(0, h.shape[0], chunk_size):
        args = (
            head,
            h[start : start + chunk_size],
            targets[start : start + chunk_size],
            temperature,
            return_entropy,
            mask[start : start + chunk_size].to(h.device) if mask is not None else None,
        )
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(_head_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _head_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)

    def scatter(values: list[Tensor]) -> Tensor:
        """The flat values (row-major, by position) at the response positions of a [B, L] tensor."""
        flat = torch.cat(values)[:n_targets] if values else hidden.new_zeros(0, dtype=torch.float32)
        full = hidden.new_zeros((batch, length), dtype=torch.float32).masked_scatter(response_mask.bool(), flat)
        return full[:rows, :columns]

    if not return_last_prompt_hidden:
        last_hidden = None
    elif window is not None:
        last_hidden = hidden[:rows, 0].detach()  # the window starts at the last prompt token
    else:
        last_hidden = _last_prompt_hidden(hidden, attention_mask, response_mask)[:rows]
    return LogProbOutput(
        token_logprobs=scatter(logps),
        entropy=scatter(entropies) if return_entropy else None,
        last_prompt_hidden=last_hidden,
    )


def _check_batch(input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor, temperature: float) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape or response_mask.shape != input_ids.shape:
        raise ValueError(
            "input_ids, attention_mask and response_mask must all be [B, L]; got "
            f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(response_mask.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if bool(response_mask[:, 0].any()):
        raise ValueError("response_mask[:, 0] is set: a response token needs at least one prompt token before it")


def _response_window(model: torch.nn.Module, attention_mask: Tensor, response_mask: Tensor, multiple: int = 1
                     ) -> tuple[Tensor, Tensor] | None:
    """Window positions [B, R] and which of them predict a response token, for rows laid out as
    ``pad_prompt_response`` lays them out (prompt, response right after it, right padding) and a decoder
    ``progpo.models.window`` runs; None otherwise (the full pass). ``R`` is rounded up to a multiple of ``multiple``
    (the extra positions predict nothing)."""
    if not supports_window(model):
        return None
    prompt_lengths = (attention_mask.bool() & ~response_mask.bool()).sum(dim=1)
    response_lengths = response_mask.sum(dim=1)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    ends = (prompt_lengths + response_lengths).unsqueeze(1)
    laid_out = (attention_mask.bool() == (columns < ends)).all() and (
        response_mask.bool() == ((columns >= prompt_lengths.unsqueeze(1)) & (columns < ends))).all()
    if not bool(laid_out):
        return None
    positions = window_positions(prompt_lengths, response_lengths, attention_mask.shape[1], multiple)
    offsets = torch.arange(positions.shape[1], device=positions.device)
    return positions, offsets < response_lengths.unsqueeze(1)


def _final_hidden(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, L, d] final-layer hidden states of the decoder (no LM head)."""
    decoder = model.get_decoder()
    if bool((attention_mask.cumprod(dim=1) == attention_mask).all()):
        # Right padding: under a causal mask no real token attends to a later pad, so the padding mask
        # changes nothing at real positions; leaving it out lets SDPA use its plain causal kernel.
        return decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    # e.g. left padding: positions must count real tokens only
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state


def _last_prompt_hidden(hidden: Tensor, attention_mask: Tensor, response_mask: Tensor) -> Tensor:
    """[B, d] hidden state of each row's last prompt token (detached): the semantic state embedding."""
    prompt_mask = attention_mask.bool() & ~response_mask.bool()
    if not bool(prompt_mask.any(dim=1).all()):
        raise ValueError("every row needs at least one prompt token to return last_prompt_hidden")
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    last = (prompt_mask.long() * positions).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last].detach()
