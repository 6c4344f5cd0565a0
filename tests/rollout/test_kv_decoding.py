"""The KV-cache decoding loop against a plain one: same answers, forced tokens without model calls, prompts once."""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from test_hf_engine import _prompts

from progpo.models.window import full_pass, supports_window
from progpo.rollout.engines.constrained import AnswerCursor, answer_space
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.engines.kv_decoding import Sampling, StopRule, _truncate, decode


def _plain_greedy(model, prompt, space, stop: StopRule, budget: int):
    """Greedy decoding from the definitions: a full forward per token (no cache), the grammar's mask on the
    logits, argmax, stop at eos / a stop string / the budget. Returns ids and temperature-1 log-probs."""
    ids: list[int] = []
    logprobs: list[float] = []
    while True:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(prompt) + ids])).logits[0, -1].float()
        allowed = space.next_ids(ids) if space is not None else None
        if allowed is not None:
            mask = torch.zeros_like(logits, dtype=torch.bool)
            mask[allowed] = True
            logits = logits.masked_fill(~mask, -torch.inf)
        token = int(logits.argmax())
        ids.append(token)
        logprobs.append(float(F.log_softmax(logits, dim=-1)[token]))
        if stop.ends(ids) or len(ids) >= budget:
            return ids, logprobs


def _rows(policy, n_tasks=4):
    """Constrained and free rows, some prompts repeated (as the N rollouts of a task start)."""
    tok = policy.tokenizer
    eos = tok.eos_token_id
    items = _prompts(policy, n_tasks)
    prompts, spaces = [], []
    for k, (prompt, obs) in enumerate(items):
        space = answer_space(tok, obs.admissible_actions, eos, budget=32)
        for _ in range(3 if k % 2 == 0 else 1):  # every other prompt three times
            prompts.append(prompt.ids)
            spaces.append(space if k % 3 else None)  # every third prompt free
    return prompts, spaces


def test_greedy_decoding_equals_the_plain_loop_and_forced_tokens_cost_nothing(tiny_policy):
    model, tok = tiny_policy.model.eval(), tiny_policy.tokenizer
    prompts, spaces = _rows(tiny_policy)
    stop = StopRule(tok, ("</action>",), [tok.eos_token_id])
    with torch.no_grad():
        rows = decode(model, prompts, [AnswerCursor(s) if s is not None else None for s in spaces],
                      Sampling(greedy=True), 32, stop, tok.pad_token_id)
    assert any(s is None for s in spaces) and any(s is not None for s in spaces)
    assert decode(model, [], [], Sampling(greedy=True), 32, stop, tok.pad_token_id) == []
    for prompt, space, row in zip(prompts, spaces, rows):
        ids, logprobs = _plain_greedy(model, prompt, space, stop, 32)
        assert row.ids == ids
        assert torch.allclose(torch.tensor(row.logprobs), torch.tensor(logprobs), atol=1e-4)
        if space is None:
            assert row.allowed is None
            continue
        assert row.allowed == [space.next_ids(ids[:t]) for t in range(len(ids))]
        forced = [lp for lp, allowed in zip(row.logprobs, row.allowed) if len(allowed) == 1]
        assert forced and all(lp == 0.0 for lp in forced)  # renormalised over one id: exactly log 1


def _decode_counting_calls(policy, prompts, spaces, greedy=False):
    model, tok = policy.model.eval(), policy.tokenizer
    calls: list[tuple[int, int]] = []
    # every decoder pass embeds its block once (the full pass and the response window alike)
    handle = model.get_decoder().embed_tokens.register_forward_hook(lambda m, a, out: calls.append(tuple(a[0].shape)))
    try:
        with torch.no_grad():
            rows = decode(model, prompts, [AnswerCursor(s) if s is not None else None for s in spaces],
                          Sampling(greedy=greedy), 32, StopRule(tok, ("</action>",), [tok.eos_token_id]),
                          tok.pad_token_id)
    finally:
        handle.remove()
    return rows, calls


def test_one_model_call_per_choice_and_each_distinct_prompt_prefilled_once(tiny_policy):
    """Prefill batch = distinct prompts; then one decoder call per loop step, where every unfinished row makes
    one choice: 1 + (the most feeds any row needs) calls. A row needs a feed before each choice whose logits
    the previous call did not give: every choice but a first one at position 0."""
    prompts, spaces = _rows(tiny_policy)
    rows, calls = _decode_counting_calls(tiny_policy, prompts, spaces)
    assert calls[0][0] == len({tuple(p) for p in prompts}) < len(prompts)
    feeds = []
    for row in rows:
        allowed = row.allowed if row.allowed is not None else [None] * len(row.ids)
        choices = [t for t, a in enumerate(allowed) if a is None or len(a) > 1]
        feeds.append(len(choices) - (1 if choices and choices[0] == 0 else 0))
    assert len(calls) == 1 + max(feeds)
    # All rows constrained: far fewer calls than transformers' generate makes (one per token of the longest).
    constrained = [(p, s) for p, s in zip(prompts, spaces) if s is not None]
    rows, calls = _decode_counting_calls(tiny_policy, [p for p, _ in constrained], [s for _, s in constrained])
    assert 2 * len(calls) <= max(len(r.ids) for r in rows)


def test_top_k_and_top_p_truncation_follow_their_definitions():
    """Against a per-row loop: top-k keeps the k most likely; top-p the smallest prefix (by probability) whose
    mass reaches p; at least one id survives; masked (-inf) ids stay out."""
    rng = random.Random(0)
    for _ in range(200):
        vocab = rng.randrange(2, 9)
        logits = torch.randn(3, vocab) * rng.choice([0.5, 2.0, 5.0])
        logits[0, rng.randrange(vocab)] = -torch.inf
        logp = F.log_softmax(logits, dim=-1)
        top_k, top_p = rng.choice([0, 1, 2, 5]), rng.choice([1.0, 0.9, 0.5, 0.01])
        out = _truncate(logp, top_k, top_p)
        for r in range(3):
            order = sorted(range(vocab), key=lambda j: -float(logp[r, j]))
            keep = [j for j in order if logp[r, j] > -torch.inf]
            if 0 < top_k < vocab:
                keep = [j for j in keep if float(logp[r, j]) >= float(logp[r, order[top_k - 1]])]
            if top_p < 1.0:
                kept, mass = [], 0.0
                for j in keep:
                    if mass >= top_p and kept:
                        break
                    kept.append(j)
                    mass += float(logp[r, j].exp())
                keep = kept
            assert sorted(j for j in range(vocab) if out[r, j] > -torch.inf) == sorted(keep)
            assert torch.equal(out[r, keep], logp[r, keep])


def test_engine_batches_hold_copies_together_and_keep_the_order(tiny_policy):
    """Identical prompts spread over the input come back in input order, each with its own sample."""
    items = _prompts(tiny_policy, 3)
    prompts = [p.ids for p, _ in items] * 3
    rng = random.Random(1)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    shuffled = [prompts[i] for i in order]
    engine = HFEngine(tiny_policy, max_new_tokens=32, batch_size=4)
    greedy = engine.generate(shuffled, greedy=True)
    alone = {tuple(p): engine.generate([p], greedy=True).response_ids[0] for p in prompts}
    assert greedy.response_ids == [alone[tuple(p)] for p in shuffled]
    hidden = {}
    for p, h in zip(shuffled, greedy.prompt_hidden):  # copies share one prefill: the same embedding
        assert torch.allclose(hidden.setdefault(tuple(p), h), h, atol=1e-5)


def test_decoding_with_the_response_window_equals_the_full_pass(tiny_policy):
    """The last layer run at the next-token position only (prefill and every feed, the cache filled alike):
    the same sampled ids, log-probs and prompt embeddings as every position through every layer."""
    model, tok = tiny_policy.model.eval(), tiny_policy.tokenizer
    assert supports_window(model)
    prompts, spaces = _rows(tiny_policy)
    stop = StopRule(tok, ("</action>",), [tok.eos_token_id])
    decoded = []
    for context in (nullcontext, full_pass):
        torch.manual_seed(0)
        with torch.no_grad(), context():
            decoded.append(decode(model, prompts, [AnswerCursor(s) if s is not None else None for s in spaces],
                                  Sampling(greedy=False), 32, stop, tok.pad_token_id))
    for window, full in zip(*decoded):
        assert window.ids == full.ids
        assert torch.allclose(torch.tensor(window.logprobs), torch.tensor(full.logprobs), atol=1e-5)
        assert torch.allclose(window.prompt_hidden, full.prompt_hidden, atol=1e-5)
