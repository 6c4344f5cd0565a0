"""The fast path keeps an iteration's numbers: on one collected batch, the old path (SDPA attention, every layer at
every position) and the new one (``bf16_matmul`` attention, the last layer at the response window) give the same
old log-probs, state embeddings, ProGPO advantages, reference log-probs, update losses and updated weights.

float32: equal to round-off (the window skips rows, it does not reorder a sum; ``bf16_matmul`` is SDPA there).
bf16 autocast (as Lightning's ``bf16-mixed`` on a CPU): the attention's products are rounded to bf16 in one path and
not in the other, so values agree to bf16 precision: the tolerances below (a bf16 ulp is 2^-8 ~ 4e-3 relative).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

from progpo.algo.credit import batch_credit
from progpo.algo.iteration import step_batch
from progpo.algo.ppo import ppo_update, updated_steps
from progpo.algo.scoring import pad_token_id, reference_logprobs, score_turns
from progpo.config import PPOConfig
from progpo.credit import ProGPO
from progpo.models.attention import REGISTERED, use_attention
from progpo.models.window import full_pass, supports_window
from tests.models.test_scoring_and_update import _collected_turns

PATHS = {"old": ("sdpa", full_pass), "new": ("bf16_matmul", nullcontext)}
# (atol, rtol) per quantity in bf16; float32 uses 1e-5 absolute throughout
# (measured: 1.9e-2, 1.3e-2, 1.9e-2, 2.3e-5, 3.7e-5; losses 1.2e-4)
BF16_TOLERANCE = {"old_logprobs": (0.05, 0), "embeddings": (0.04, 0), "ref_logprobs": (0.05, 0),
                  "advantages": (1e-3, 0), "weights": (2e-4, 0)}


def _iteration_numbers(policy, turns, path: str, bf16: bool) -> dict:
    """Steps 2-4 of an iteration (score, credit, reference, one PPO update with SGD) on ``turns``."""
    attention, context = PATHS[path]
    actor = copy.deepcopy(policy.model)
    use_attention(actor, attention)
    assert supports_window(actor)  # the new path does take the window: the comparison is not vacuous
    reference = copy.deepcopy(actor).eval()
    pad = pad_token_id(policy.tokenizer)
    cfg = PPOConfig(minibatch_size=16, micro_batch_size=4, epochs=1, skip_zero_advantage=True)
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.1)
    precision = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False) if bf16 else nullcontext()
    with context(), precision:
        scored = score_turns(actor, None, turns, pad, cfg.micro_batch_size, recompute_old=True)
        advantages = batch_credit(ProGPO(history=2), step_batch(turns, scored.embeddings)).advantage.float()
        trained = updated_steps(turns, advantages, cfg.skip_zero_advantage)
        scored = replace(scored, ref_logprobs=reference_logprobs(reference, turns, trained, pad,
                                                                 cfg.micro_batch_size, scored.representative))
        metrics = ppo_update(actor, optimizer, lambda loss: loss.backward(), turns, scored, advantages, cfg, pad)
    return {"old_logprobs": torch.cat(scored.old_logprobs), "embeddings": scored.embeddings.float(),
            "ref_logprobs": torch.cat([r for r in scored.ref_logprobs if r is not None]),
            "advantages": advantages, "metrics": metrics,
            "weights": torch.cat([p.detach().flatten() for p in actor.parameters()]), "trained": len(trained)}


@pytest.mark.skipif(not REGISTERED, reason="bf16_matmul needs transformers >= 5")
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_the_new_path_gives_the_old_paths_numbers_on_one_batch(tiny_policy, fake_suite, bf16):
    # real turns of the HF engine; rewards spread over steps so that credit is not zero everywhere
    turns = [replace(t, reward=float((t.traj + t.t) % 3 == 0))
             for t in _collected_turns(tiny_policy, fake_suite, constrain_to_admissible=True)]
    old = _iteration_numbers(tiny_policy, turns, "old", bf16)
    new = _iteration_numbers(tiny_policy, turns, "new", bf16)
    assert 0 < old["trained"] == new["trained"] and old["advantages"].abs().gt(0.1).any()
    assert not torch.equal(old["weights"], torch.cat([p.flatten() for p in tiny_policy.model.parameters()]))
    for key in ("old_logprobs", "embeddings", "ref_logprobs", "advantages", "weights"):
        atol, rtol = BF16_TOLERANCE[key] if bf16 else (1e-5, 0)
        torch.testing.assert_close(new[key], old[key], atol=atol, rtol=rtol, msg=key)
    for key in ("loss/policy", "loss/kl", "loss/total"):
        assert new["metrics"][key] == pytest.approx(old["metrics"][key], abs=1e-3 if bf16 else 1e-6), key
    if bf16:  # and the new path strays no further from float32 than bf16 did before (mean |error| 6.5e-4 both)
        exact = _iteration_numbers(tiny_policy, turns, "old", bf16=False)["old_logprobs"]
        error = {path: (numbers["old_logprobs"] - exact).abs().mean() for path, numbers in (("old", old), ("new", new))}
        assert error["new"] <= 1.2 * error["old"], error
