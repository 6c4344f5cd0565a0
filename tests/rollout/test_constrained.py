"""Admissible-constrained decoding: every answer is one of the commands given, even unlikely ones."""

from __future__ import annotations

import pytest
import torch
from test_hf_engine import _prompts

from progpo.rollout.engines.constrained import allowed_sequences
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.projection import project_action


def test_constrained_answers_are_admissible_even_against_the_models_preference(tiny_policy):
    items = _prompts(tiny_policy, 3)
    # Commands the model would not choose on its own: reversed admissible lists, only the last two kept.
    options = [tuple(sorted(obs.admissible_actions, reverse=True)[:2]) for _, obs in items]
    engine = HFEngine(tiny_policy, max_new_tokens=32, constrain_to_admissible=True)
    torch.manual_seed(0)
    for greedy in (True, False):
        gen = engine.generate([p.ids for p, _ in items], greedy=greedy, admissible=options)
        for text, allowed in zip(gen.texts, options):
            projected = project_action(text, allowed)
            assert projected.valid, (text, allowed)
            assert text == f"<action>{projected.action}</action>"


def test_unconstrained_engine_ignores_the_admissible_lists(tiny_policy):
    items = _prompts(tiny_policy, 2)
    options = [("look",) for _ in items]
    free = HFEngine(tiny_policy, max_new_tokens=32, constrain_to_admissible=False)
    gen = free.generate([p.ids for p, _ in items], greedy=True, admissible=options)
    assert any(t != "<action>look</action>" for t in gen.texts)


def test_placeholder_commands_are_not_enumerated(tiny_policy):
    tok = tiny_policy.tokenizer
    assert allowed_sequences(tok, ("search[<query>]",), tok.eos_token_id) is None
    assert allowed_sequences(tok, (), tok.eos_token_id) is None
    seqs = allowed_sequences(tok, ("look", "inventory"), tok.eos_token_id)
    assert [tok.decode(s[:-1]) for s in seqs] == ["<action>look</action>", "<action>inventory</action>"]
    assert all(s[-1] == tok.eos_token_id for s in seqs)


def test_constrained_logprobs_are_those_of_the_acting_policy(tiny_policy):
    """Engine log-probs = teacher-forced log-probs renormalised over the trie's allowed ids; tokens allowed."""
    from progpo.models.logprobs import forward_logprobs, pad_prompt_response
    from progpo.rollout.engines.constrained import next_tokens

    items = _prompts(tiny_policy, 3)
    options = [tuple(obs.admissible_actions) for _, obs in items]
    prompts = [p.ids for p, _ in items]
    engine = HFEngine(tiny_policy, max_new_tokens=32, constrain_to_admissible=True, temperature=1.0)
    torch.manual_seed(1)
    gen = engine.generate(prompts, admissible=options)
    tok, eos = tiny_policy.tokenizer, engine.eos_ids[0]
    for ids, per_position, admissible in zip(gen.response_ids, gen.allowed_token_ids, options):
        seqs = allowed_sequences(tok, admissible, eos)
        assert per_position == [next_tokens(seqs, ids[:t], eos) for t in range(len(ids))]
        assert all(token in allowed for token, allowed in zip(ids, per_position))
        assert ids in seqs or ids + [eos] in seqs  # a whole allowed answer (stops at </action> or eos)
    batch = pad_prompt_response(prompts, gen.response_ids, tok.pad_token_id)
    with torch.no_grad():
        constrained = forward_logprobs(
            tiny_policy.model, batch.input_ids, batch.attention_mask, batch.response_mask,
            allowed=gen.allowed_token_ids,
        )  # fmt: skip
        free = forward_logprobs(tiny_policy.model, batch.input_ids, batch.attention_mask, batch.response_mask)
    for row, (prompt, lps) in enumerate(zip(prompts, gen.logprobs)):
        span = slice(len(prompt), len(prompt) + len(lps))
        torch.testing.assert_close(constrained.token_logprobs[row, span], torch.tensor(lps), atol=1e-4, rtol=0)
        # renormalising over a subset can only raise a token's probability
        assert bool((constrained.token_logprobs[row, span] >= free.token_logprobs[row, span] - 1e-6).all())
    # an unconstrained engine reports no allowed ids
    assert HFEngine(tiny_policy, constrain_to_admissible=False).generate(prompts[:1]).allowed_token_ids == [None]


def test_reasoning_budget_then_a_constrained_action_with_consistent_logprobs(tmp_path):
    from toy_env import save_random_qwen2

    from progpo.models.hf import build_hf
    from progpo.models.logprobs import forward_logprobs, pad_prompt_response

    # A random model writes anything: its "reasoning" fills the budget, and the answer must still be admissible.
    policy = build_hf(path=save_random_qwen2(tmp_path / "qwen"), device="cpu", dtype="float32",
                      max_context=512, gradient_checkpointing=False)
    tok = policy.tokenizer
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("you see a mug", "go on", "look around")]
    options = [("look", "take mug 1 from table 1"), ("go to table 1",), ("inventory", "look")]
    engine = HFEngine(policy, temperature=0.8, max_new_tokens=48, constrain_to_admissible=True, reasoning_tokens=12)
    torch.manual_seed(0)
    gen = engine.generate(prompts, admissible=options)
    for text, ids, allowed, admissible in zip(gen.texts, gen.response_ids, gen.allowed_token_ids, options):
        n_free = sum(a is None for a in allowed)
        assert 0 < n_free <= 12 and all(a is None for a in allowed[:n_free])  # free thoughts first ...
        answer = tok.decode(ids[n_free:], skip_special_tokens=True)
        assert answer.startswith("<action>") and project_action(answer, admissible).valid  # ... then an action
        assert project_action(text, admissible).valid
    # The reported log-probs are those of the policy that acted: full softmax on the thoughts, renormalised over
    # the allowed ids on the answer; the teacher-forced pass with the same allowed ids reproduces them.
    batch = pad_prompt_response(prompts, gen.response_ids, tok.pad_token_id)
    with torch.no_grad():
        out = forward_logprobs(policy.model, batch.input_ids, batch.attention_mask, batch.response_mask,
                               temperature=0.8, allowed=gen.allowed_token_ids)
    teacher = out.token_logprobs[batch.response_mask.bool()]
    torch.testing.assert_close(teacher, torch.tensor([lp for row in gen.logprobs for lp in row]), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="reasoning_tokens"):
        HFEngine(policy, max_new_tokens=16, reasoning_tokens=16)


def test_vllm_refuses_constrained_decoding_with_the_reason_and_the_fix(tiny_policy):
    from progpo.rollout.engines.vllm_engine import VLLMEngine

    # raised before vLLM is even imported, so this runs without vllm installed
    with pytest.raises(ValueError, match=r"constrain_to_admissible=true is not supported with rollout=vllm.*rollout=hf"):
        VLLMEngine(tiny_policy, constrain_to_admissible=True)


def test_the_answer_cursor_allows_what_the_plain_definition_allows():
    """Random answer sets and random walks (on and off the answers): at every step the cursor's allowed ids
    equal ``next_tokens`` on the full prefix walked so far."""
    import random

    from progpo.rollout.engines.constrained import AnswerCursor, AnswerSpace, next_tokens

    rng = random.Random(0)
    eos, vocab = 0, 12
    for _ in range(300):
        options = [[rng.randrange(1, 5) for _ in range(rng.randrange(1, 6))] + [eos] for _ in range(rng.randrange(1, 5))]
        cursor = AnswerCursor(AnswerSpace(options, (), eos))
        prefix: list[int] = []
        for _ in range(7):
            allowed = cursor.allowed()
            assert allowed == next_tokens(options, prefix, eos)
            assert cursor.allowed() is allowed  # asked twice at one position: computed once
            # mostly a token the grammar allows, sometimes any token (one leaving the set)
            token = rng.choice(allowed) if rng.random() < 0.9 else rng.randrange(vocab)
            cursor.advance(token)
            prefix.append(token)


def test_answer_ids_are_memoised_per_tokenizer_and_dropped_with_it():
    """The memo returns what the tokenizer itself gives, never another tokenizer's ids (an id reused after a
    tokenizer is freed must not hit), and keeps no tokenizer alive."""
    import gc
    import weakref

    from progpo.rollout.engines import constrained

    class CountingTokenizer:
        def __init__(self, offset: int) -> None:
            self.offset, self.calls = offset, 0

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            self.calls += 1
            return {"input_ids": [self.offset + ord(c) for c in text]}

    first = CountingTokenizer(0)
    ids = constrained.allowed_sequences(first, ["go to desk 1", "look"], eos_id=7)
    again = constrained.allowed_sequences(first, ["go to desk 1", "look"], eos_id=7)
    assert ids == again and first.calls == 2  # second listing: no tokenisation
    space = constrained.answer_space(first, ["search[<query>]"], eos_id=7, task_text="red shoes")
    assert space is not None and constrained.answer_space(first, ["search[<query>]"], 7, "red shoes") is not None
    del space
    assert ids[1] == [ord(c) for c in "<action>look</action>"] + [7]
    gone = weakref.ref(first)
    del first, again
    gc.collect()
    assert gone() is None  # the memo did not keep it alive
    second = CountingTokenizer(1000)  # may reuse the freed object's id
    assert constrained.allowed_sequences(second, ["look"], eos_id=7)[0][0] == 1000 + ord("<")
    assert second in constrained._CACHES
