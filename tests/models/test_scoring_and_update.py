"""The iteration's scoring pass and PPO update (``progpo.algo``) on the tiny policy, outside a Lightning Trainer.

Scoring shares one pass among identical turns; the update can leave out steps whose advantage is exactly 0.
Both are shortcuts, so both are checked against the plain computation they replace.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import progpo.algo.ppo
import progpo.algo.scoring
from progpo.algo.ppo import ppo_update
from progpo.algo.scoring import first_of_each, pad_token_id, score_turns
from progpo.config import PPOConfig
from progpo.models.logprobs import forward_logprobs
from progpo.types import Turn


def _turns(tokenizer) -> list[Turn]:
    prompts = ["Task: put a mug in cabinet. Now: You see a desk 1.", "Task: look at the cd. Now: On the desk 1."]
    responses = ["<action>go to desk 1</action>", "<action>open cabinet 1</action>", "<action>look</action>"]
    turns = []
    for k in range(9):  # every (prompt, response) pair appears more than once
        prompt = tokenizer.encode(prompts[k % 2], add_special_tokens=False)
        response = tokenizer.encode(responses[k % 3], add_special_tokens=False)
        vocab = len(tokenizer)
        # constrained rows: the taken token plus two others allowed at each position
        allowed = [sorted({tok, (tok + 1) % vocab, (tok + 7) % vocab}) for tok in response] if k % 2 else None
        turns.append(Turn(traj=k, group=k % 3, t=0, prompt_ids=prompt, response_ids=response,
                          sample_logprobs=[0.0] * len(response), obs_id=0, response_text="",
                          action="", valid=True, reward=0.0, allowed_token_ids=allowed))
    return turns


class Update:
    """The update's inputs for one policy: actor, frozen reference, an SGD optimizer, the PPO settings."""

    def __init__(self, policy, **ppo) -> None:
        self.actor = policy.model
        self.reference = copy.deepcopy(policy.model).eval()
        self.cfg = PPOConfig(**{"minibatch_size": 64, "micro_batch_size": 4, **ppo})
        self.pad = pad_token_id(policy.tokenizer)
        # SGD, not the configured AdamW: Adam's per-parameter normalisation turns float round-off in near-zero
        # gradients into visible steps, and these tests compare two updates parameter by parameter.
        self.optimizer = torch.optim.SGD(self.actor.parameters(), lr=0.1)

    def score(self, turns):
        return score_turns(self.actor, self.reference, turns, self.pad, self.cfg.micro_batch_size)

    def update(self, turns, scored, advantages):
        return ppo_update(self.actor, self.optimizer, lambda loss: loss.backward(), turns, scored, advantages,
                          self.cfg, self.pad)


def test_identical_turns_are_scored_once_with_the_same_numbers_as_alone(tiny_policy, monkeypatch):
    module = Update(tiny_policy)
    turns = _turns(tiny_policy.tokenizer)
    rows = []

    def counting(model, input_ids, *args, **kwargs):
        rows.append(input_ids.shape[0])
        return forward_logprobs(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(progpo.algo.scoring, "forward_logprobs", counting)
    shared = module.score(turns)
    monkeypatch.undo()
    # 9 turns, 6 distinct (prompt k%2, response k%3; the constraint goes with the prompt): actor + reference rows
    assert sum(rows) == 2 * 6
    for i, turn in enumerate(turns):
        alone = module.score([turn])
        torch.testing.assert_close(shared.old_logprobs[i], alone.old_logprobs[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(shared.ref_logprobs[i], alone.ref_logprobs[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(shared.embeddings[i], alone.embeddings[0], atol=1e-5, rtol=0)


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.actor.named_parameters()}


def test_skipping_zero_advantage_steps_equals_updating_on_the_others_alone(tiny_policy):
    turns = _turns(tiny_policy.tokenizer)
    advantages = torch.tensor([0.0, 1.0, 0.0, -0.5, 0.0, 0.8, 0.0, 0.0, -1.2])
    keep = [i for i in range(len(turns)) if advantages[i] != 0]

    skipping = Update(copy.deepcopy(tiny_policy), skip_zero_advantage=True)
    scored = skipping.score(turns)
    metrics = skipping.update(turns, scored, advantages)
    assert metrics["train/steps_updated"] == len(keep)

    subset = Update(copy.deepcopy(tiny_policy), skip_zero_advantage=False)
    sub_turns = [turns[i] for i in keep]
    subset.update(sub_turns, subset.score(sub_turns), advantages[keep])
    after_skip, after_subset = _params(skipping), _params(subset)
    for name in after_skip:
        torch.testing.assert_close(after_skip[name], after_subset[name], atol=1e-6, rtol=0)


def test_identical_turns_share_one_update_forward_and_update_as_if_each_had_its_own(tiny_policy, monkeypatch):
    turns = _turns(tiny_policy.tokenizer)  # 9 turns, 6 distinct; duplicates get different advantages
    advantages = torch.tensor([1.0, -0.5, 0.3, 0.7, -1.0, 0.2, 0.9, -0.4, 0.6])
    runs = {}
    for name in ("shared", "plain"):
        module = Update(copy.deepcopy(tiny_policy), epochs=3, minibatch_size=9, micro_batch_size=4)
        scored = module.score(turns)
        if name == "plain":  # no duplicates known: every step gets its own forward, the computation being replaced
            scored = replace(scored, representative=list(range(len(turns))))
        rows = []

        def counting(model, input_ids, *args, rows=rows, **kwargs):
            rows.append(input_ids.shape[0])
            return forward_logprobs(model, input_ids, *args, **kwargs)

        monkeypatch.setattr(progpo.algo.ppo, "forward_logprobs", counting)
        metrics = module.update(turns, scored, advantages)
        monkeypatch.undo()
        runs[name] = (sum(rows), metrics, _params(module))
    (rows_shared, metrics_shared, after_shared), (rows_plain, metrics_plain, after_plain) = runs["shared"], runs["plain"]
    assert rows_plain == 3 * 9
    # one epoch's 9 steps in micro-batches of 4, duplicates side by side: at most 6 distinct rows, at least one
    # per micro-batch more than that when a pair straddles a boundary
    assert 3 * 6 <= rows_shared <= 3 * 8
    assert metrics_shared["loss/clip_fraction"] == pytest.approx(metrics_plain["loss/clip_fraction"])
    for key in ("loss/total", "loss/policy", "loss/kl", "loss/entropy", "loss/grad_norm"):
        assert metrics_shared[key] == pytest.approx(metrics_plain[key], rel=1e-5, abs=1e-7), key
    for name in after_shared:
        torch.testing.assert_close(after_shared[name], after_plain[name], atol=1e-6, rtol=0)
    start = {k: v.detach() for k, v in tiny_policy.model.named_parameters()}
    assert any(not torch.equal(after_plain[k], v) for k, v in start.items())  # the update did move the weights


@pytest.mark.parametrize("skip", [True, False])
def test_all_zero_advantages_update_only_when_not_skipped(tiny_policy, skip):
    module = Update(tiny_policy, skip_zero_advantage=skip, entropy_coef=0.01)
    turns = _turns(tiny_policy.tokenizer)
    before = _params(module)
    metrics = module.update(turns, module.score(turns), torch.zeros(len(turns)))
    after = _params(module)
    moved = any(not torch.equal(before[k], after[k]) for k in before)
    assert moved is (not skip)  # only the entropy bonus can move it, and only when those steps are kept
    assert metrics["train/steps_updated"] == (0 if skip else len(turns))
    assert "loss/policy" in metrics and "loss/kl" in metrics  # the same keys whether or not anything was updated


def _collected_turns(policy, suite, **engine_kwargs):
    """Real turns: the HF engine plays the fake room suite with the tiny policy (4 tasks x 2 rollouts)."""
    from envs.pool import EnvPool
    from progpo.rollout.collector import RolloutCollector
    from progpo.rollout.engines.hf_engine import HFEngine
    from progpo.rollout.prompt import PromptBuilder

    engine = HFEngine(policy, batch_size=5, **engine_kwargs)  # several generate calls, unequal prompt lengths
    prompts = PromptBuilder(policy.tokenizer, history=2, max_prompt_tokens=policy.max_context - engine.max_new_tokens,
                            style=policy.prompt_style)
    collector = RolloutCollector(suite, engine, prompts, lambda n: EnvPool(suite.env_factory, n, 0), max_steps=4)
    torch.manual_seed(0)
    try:
        return collector.collect(suite.train_tasks[:4], 2).turns
    finally:
        collector.close()


@pytest.mark.parametrize("engine_kwargs", [
    {"constrain_to_admissible": True},
    {"constrain_to_admissible": False},
    {"constrain_to_admissible": True, "reasoning_tokens": 4},
], ids=["constrained", "free", "reasoning-then-constrained"])
def test_the_engines_sampling_values_equal_the_recomputed_old_logprobs_and_embeddings(
        tiny_policy, fake_suite, engine_kwargs):
    turns = _collected_turns(tiny_policy, fake_suite, **engine_kwargs)
    assert turns and all(t.actor_scored for t in turns)
    module = Update(tiny_policy)
    reused = score_turns(module.actor, module.reference, turns, module.pad, 4)
    recomputed = score_turns(module.actor, module.reference, turns, module.pad, 4, recompute_old=True)
    for a, b, turn in zip(reused.old_logprobs, recomputed.old_logprobs, turns):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape == (len(turn.response_ids),)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(reused.embeddings, recomputed.embeddings, atol=1e-5, rtol=1e-5)
    for a, b in zip(reused.ref_logprobs, recomputed.ref_logprobs):
        assert torch.equal(a, b)  # the reference pass is the same in both


def test_reused_scoring_runs_only_the_reference_and_other_temperatures_recompute(tiny_policy, fake_suite,
                                                                                  monkeypatch):
    module = Update(tiny_policy)
    calls = []
    real = progpo.algo.scoring.forward_logprobs
    monkeypatch.setattr(progpo.algo.scoring, "forward_logprobs",
                        lambda model, *a, **k: calls.append(model) or real(model, *a, **k))
    turns = _collected_turns(tiny_policy, fake_suite, constrain_to_admissible=True)
    score_turns(module.actor, module.reference, turns, module.pad, 4)
    assert calls and all(model is module.reference for model in calls)
    # At T != 1 the sampling log-probs are not the trained policy's: the engine promises nothing, scoring recomputes.
    hot = _collected_turns(tiny_policy, fake_suite, constrain_to_admissible=True, temperature=1.5)
    assert not any(t.actor_scored for t in hot)
    calls.clear()
    score_turns(module.actor, module.reference, hot, module.pad, 4)
    assert any(model is module.actor for model in calls)


def test_reference_logprobs_of_some_steps_equal_those_of_all_steps_there_and_none_elsewhere(tiny_policy):
    from progpo.algo.scoring import reference_logprobs

    module = Update(tiny_policy)
    turns = _turns(tiny_policy.tokenizer)
    scored = score_turns(module.actor, module.reference, turns, module.pad, 4)
    full = scored.ref_logprobs
    some = reference_logprobs(module.reference, turns, [1, 4, 8], module.pad, 4)
    assert [i for i, r in enumerate(some) if r is not None] == [1, 4, 8]
    for i in (1, 4, 8):
        torch.testing.assert_close(some[i], full[i], atol=1e-6, rtol=0)
    # the iteration hands over the duplicate map score_turns built instead of rebuilding it: same values
    assert scored.representative == first_of_each(turns) and len(set(scored.representative)) < len(turns)
    handed = reference_logprobs(module.reference, turns, [1, 4, 8], module.pad, 4, scored.representative)
    for i in (1, 4, 8):
        torch.testing.assert_close(handed[i], some[i], atol=0, rtol=0)
