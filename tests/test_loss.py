"""ppo_loss against numbers worked out by hand and against a plain per-token loop."""

from __future__ import annotations

import math

import pytest
import torch

from progpo.algo.loss import KL_CLAMP, ppo_loss


def test_hand_computed_example():
    # Two response tokens, one sequence advantage of +2, clip 0.2, kl_coef 0.01.
    # token 1: ratio = exp(-1 - -1) = 1      -> surrogate -2 * 1 = -2 (not clipped)
    # token 2: ratio = exp(-0.5 - -1) = 1.6487 -> max(-2 * 1.6487, -2 * 1.2) = -2.4 (clipped)
    # policy loss = (-2 - 2.4) / 2 = -2.2 ; clip fraction = 1/2
    # k3 KL: token 1 delta 0 -> 0 ; token 2 delta = ref - logp = -1 - -0.5 = -0.5 -> e^-0.5 + 0.5 - 1 = 0.1065307
    # kl = 0.0532653 ; loss = -2.2 + 0.01 * 0.0532653 = -2.1994673
    # approx_kl: token 2: (1.6487213 - 1) - 0.5 = 0.1487213 -> mean 0.0743606
    logp = torch.tensor([[-1.0, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    out = ppo_loss(logp, old, ref, torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 2))
    assert out.policy_loss.item() == pytest.approx(-2.2, abs=1e-9)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    assert out.kl.item() == pytest.approx(0.0532653, abs=1e-7)
    assert out.loss.item() == pytest.approx(-2.1994673, abs=1e-7)
    assert out.approx_kl.item() == pytest.approx(0.0743606, abs=1e-7)
    assert out.entropy.item() == 0.0


def test_negative_advantage_clips_below_and_not_above():
    # A = -1. ratio 0.5: max(0.5, 0.8) = 0.8 (clipped, the policy cannot profit from pushing further down).
    # ratio 1.5: max(1.5, 1.2) = 1.5 (unclipped: the bad action made more likely is fully penalised).
    logp = torch.log(torch.tensor([[0.5, 1.5]], dtype=torch.float64))
    old = torch.zeros(1, 2, dtype=torch.float64)
    out = ppo_loss(logp, old, None, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2), kl_coef=0.0)
    assert out.policy_loss.item() == pytest.approx((0.8 + 1.5) / 2, abs=1e-9)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    assert out.kl.item() == 0.0


def _loop_reference(logp, old, ref, adv, mask, clip, kl_coef, ent, ent_coef):
    """Plain Python, one token at a time."""
    pg, kl, clipped, ent_sum, n = 0.0, 0.0, 0.0, 0.0, 0
    for b in range(len(logp)):
        for t in range(len(logp[0])):
            if not mask[b][t]:
                continue
            n += 1
            ratio = math.exp(logp[b][t] - old[b][t])
            a = adv[b][t]
            s1, s2 = -a * ratio, -a * min(max(ratio, 1 - clip), 1 + clip)
            pg += max(s1, s2)
            clipped += 1.0 if s2 > s1 else 0.0
            d = ref[b][t] - logp[b][t]
            kl += min(max(math.exp(d) - d - 1, -KL_CLAMP), KL_CLAMP)
            ent_sum += ent[b][t]
    pg, kl, ent_mean = pg / n, kl / n, ent_sum / n
    return pg + kl_coef * kl - ent_coef * ent_mean, pg, kl, clipped / n


@pytest.mark.parametrize("per_sequence", [False, True])
def test_matches_plain_loop_on_random_inputs(per_sequence):
    g = torch.Generator().manual_seed(0)
    B, L = 5, 7
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.5
    adv_seq = torch.randn(B, generator=g, dtype=torch.float64)
    adv = (
        adv_seq[:, None].expand(B, L).clone()
        if per_sequence
        else torch.randn(B, L, generator=g, dtype=torch.float64)
    )
    mask = torch.rand(B, L, generator=g) > 0.3
    mask[0, 0] = True
    ent = torch.rand(B, L, generator=g, dtype=torch.float64)
    out = ppo_loss(
        logp,
        old,
        ref,
        adv_seq if per_sequence else adv,
        mask.long(),
        clip_ratio=0.2,
        kl_coef=0.05,
        entropy=ent,
        entropy_coef=0.01,
    )
    loss, pg, kl, cf = _loop_reference(
        logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.05, ent.tolist(), 0.01
    )
    assert out.loss.item() == pytest.approx(loss, abs=1e-12)
    assert out.policy_loss.item() == pytest.approx(pg, abs=1e-12)
    assert out.kl.item() == pytest.approx(kl, abs=1e-12)
    assert out.clip_fraction.item() == pytest.approx(cf, abs=1e-12)


def test_gradient_is_zero_on_clipped_tokens_only():
    logp = torch.tensor([[0.5, 0.1]], requires_grad=True)  # ratios e^0.5 (clipped for A>0) and e^0.1
    out = ppo_loss(logp, torch.zeros(1, 2), None, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.0)
    out.loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-math.exp(0.1) / 2, rel=1e-6)


def test_masked_tokens_do_not_matter():
    logp = torch.tensor([[-1.0, -2.0, 50.0]])
    base = ppo_loss(logp, logp.clone(), logp.clone(), torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
    changed = logp.clone()
    changed[0, 2] = -80.0
    other = ppo_loss(changed, logp.clone(), logp.clone(), torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
    assert base.loss.item() == other.loss.item()


def test_kl_is_zero_at_the_reference_positive_elsewhere_and_clamped():
    logp = torch.tensor([[-1.0, -1.0]])
    assert ppo_loss(logp, logp, logp, torch.zeros(1), torch.ones(1, 2)).kl.item() == 0.0
    ref = torch.tensor([[-1.3, -0.2]])
    assert ppo_loss(logp, logp, ref, torch.zeros(1), torch.ones(1, 2)).kl.item() > 0
    huge = torch.tensor([[30.0, 30.0]])  # exp(31) overflows the estimator: clamped to 10 per token
    assert ppo_loss(logp, logp, huge, torch.zeros(1), torch.ones(1, 2)).kl.item() == pytest.approx(KL_CLAMP)


def test_token_normalizer_makes_micro_batches_add_up():
    g = torch.Generator().manual_seed(1)
    logp, old, ref = (-torch.rand(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.2).long()
    full = ppo_loss(logp, old, ref, adv, mask)
    n = float(mask.sum())
    halves = [
        ppo_loss(logp[s], old[s], ref[s], adv[s], mask[s], token_normalizer=n)
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert sum(h.loss.item() for h in halves) == pytest.approx(full.loss.item(), abs=1e-12)


def test_entropy_bonus_lowers_the_loss():
    logp = torch.full((1, 3), -1.0)
    ent = torch.full((1, 3), 2.0)
    a = ppo_loss(logp, logp, None, torch.ones(1), torch.ones(1, 3), kl_coef=0.0, entropy=ent)
    b = ppo_loss(
        logp, logp, None, torch.ones(1), torch.ones(1, 3), kl_coef=0.0, entropy=ent, entropy_coef=0.1
    )
    assert a.entropy.item() == pytest.approx(2.0)
    assert b.loss.item() == pytest.approx(a.loss.item() - 0.2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"clip_ratio": 0.0}, "clip_ratio"),
        ({"clip_ratio": -0.1}, "clip_ratio"),
        ({"clip_ratio_high": 0.0}, "clip_ratio_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"entropy_coef": 0.1}, "entropy"),
        ({"token_normalizer": 0.0}, "token_normalizer"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        ppo_loss(x, x, x, torch.zeros(2), torch.ones(2, 3), **kwargs)


def test_shape_errors_and_empty_mask():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logprobs"):
        ppo_loss(x, torch.zeros(2, 4), x, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        ppo_loss(x, x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_loss(x, x, None, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="no tokens"):
        ppo_loss(x, x, x, torch.zeros(2), torch.zeros(2, 3))
