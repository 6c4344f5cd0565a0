"""PPO-style clipped surrogate with a low-variance KL penalty to the reference policy.

One function, one typed output: the module calls it once per minibatch and logs every field.
Everything is a token-mean over the response tokens of the minibatch (the paper follows verl's
``token-mean`` aggregation), so long and short responses weigh each of their tokens equally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

KL_CLAMP = 10.0  # verl clamps the k3 estimator to [-10, 10] so one outlier token cannot dominate


@dataclass
class LossOutput:
    """Scalar tensors; only ``loss`` carries the gradient the optimizer needs (the others are detached)."""

    loss: Tensor  # policy_loss + kl_coef * kl - entropy_coef * entropy
    policy_loss: Tensor  # clipped surrogate, token-mean
    kl: Tensor  # k3 KL(pi || ref) estimate, token-mean (0 when ref_logprobs is None)
    clip_fraction: Tensor  # share of response tokens where the clipped term was the active one
    approx_kl: Tensor  # k3 estimate of KL(old || new), CleanRL's ``approx_kl`` (a drift diagnostic)
    entropy: Tensor  # token-mean entropy (0 when no entropy was given)


def _token_mean(x: Tensor, mask: Tensor, normalizer: float | Tensor) -> Tensor:
    return (x * mask).sum() / normalizer


def ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio: float = 0.2,
    kl_coef: float = 0.01,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    clip_ratio_high: float | None = None,
    token_normalizer: float | None = None,
) -> LossOutput:
    """Clipped policy-gradient loss with a k3 KL penalty to the reference, token-mean over the minibatch.

    Args:
        logprobs: [B, L] log-probs of the taken tokens under the current policy (with grad).
        old_logprobs: [B, L] log-probs under the policy that collected the data (no grad).
        ref_logprobs: [B, L] log-probs under the frozen reference policy, or None when ``kl_coef == 0``.
        advantages: [B, L] per-token advantages (already broadcast over the step's response tokens), or
            [B] per-sequence advantages, broadcast here over the response tokens.
        response_mask: [B, L] 1 for response tokens that are trained on, 0 for prompt and padding.
        clip_ratio: PPO clip epsilon (default 0.2); the ratio is clipped to [1 - eps, 1 + eps_high].
        kl_coef: weight of the KL-to-reference penalty (default 0.01, the paper's value); 0 disables it.
        entropy: optional [B, L] per-token entropy of the current policy (with grad if entropy_coef > 0).
        entropy_coef: weight of the entropy bonus (default 0); needs ``entropy``.
        clip_ratio_high: upper clip epsilon if different from ``clip_ratio`` (DAPO's clip-higher); None = same.
        token_normalizer: divide the token sums by this count instead of this call's number of response
            tokens. Pass the whole minibatch's token count when it is split into micro-batches for gradient
            accumulation, so the accumulated gradient equals the token-mean over the minibatch.

    Raises:
        ValueError: on non-positive clip ratios, negative coefficients, mismatched shapes, a mask without
            tokens, or a missing ``ref_logprobs``/``entropy`` that a non-zero coefficient needs.
    """
    eps_low = clip_ratio
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if not (math.isfinite(eps_low) and eps_low > 0):
        raise ValueError(f"clip_ratio must be a finite number > 0, got {clip_ratio!r}")
    if not (math.isfinite(eps_high) and eps_high > 0):
        raise ValueError(f"clip_ratio_high must be a finite number > 0 (or None), got {clip_ratio_high!r}")
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
    if not entropy_coef >= 0:
        raise ValueError(f"entropy_coef must be >= 0, got {entropy_coef!r}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, L], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    named = {"old_logprobs": old_logprobs, "response_mask": response_mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    if entropy is not None:
        named["entropy"] = entropy
    for name, t in named.items():
        if t.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(t.shape)}")
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(1).expand(shape)
    elif advantages.shape != shape:
        raise ValueError(
            f"advantages must be [B, L] {tuple(shape)} or [B] ({shape[0]},), got {tuple(advantages.shape)}"
        )
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            "ref_logprobs is None but kl_coef > 0: pass the reference log-probs or set kl_coef=0"
        )
    if entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token `entropy` tensor")

    mask = response_mask.to(logprobs.dtype)
    n_tokens = mask.sum()
    if token_normalizer is None:
        if n_tokens.item() == 0:
            raise ValueError("response_mask selects no tokens: a minibatch needs at least one response token")
        normalizer: float | Tensor = n_tokens
    else:
        if not token_normalizer > 0:
            raise ValueError(f"token_normalizer must be > 0 (or None), got {token_normalizer!r}")
        normalizer = float(token_normalizer)

    advantages = advantages.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    surrogate = -advantages * ratio
    surrogate_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    policy_loss = _token_mean(torch.maximum(surrogate, surrogate_clipped), mask, normalizer)
    loss = policy_loss

    zero = logprobs.new_zeros(())
    if ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = _token_mean(torch.clamp(torch.exp(delta) - delta - 1.0, -KL_CLAMP, KL_CLAMP), mask, normalizer)
        if kl_coef > 0:
            loss = loss + kl_coef * kl
    else:
        kl = zero
    if entropy is not None:
        mean_entropy = _token_mean(entropy, mask, normalizer)
        if entropy_coef > 0:
            loss = loss - entropy_coef * mean_entropy
    else:
        mean_entropy = zero

    with torch.no_grad():
        clip_fraction = _token_mean((surrogate_clipped > surrogate).to(mask.dtype), mask, normalizer)
        approx_kl = _token_mean((ratio - 1.0) - log_ratio, mask, normalizer)
    return LossOutput(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl.detach(),
        clip_fraction=clip_fraction,
        approx_kl=approx_kl,
        entropy=mean_entropy.detach(),
    )
