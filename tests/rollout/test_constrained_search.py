"""Constrained ``search[<query>]``: queries of the instruction's words (or free), log-probs renormalised over what
was allowed, checked against a plain loop over full logits."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from envs.webshop.actions import SEARCH_PLACEHOLDER, resolve_action
from progpo.rollout.engines.constrained import AnswerSpace, answer_space
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.projection import ACTION_CLOSE, ACTION_OPEN, extract_action, query_words
from progpo.types import Policy

INSTRUCTION = "i need a waterproof phone case that is shock proof, with color: navy, and price lower than 40.00 dollars"
BUDGET = 32


@functools.lru_cache(maxsize=2)
def _tokenizer(bracket_words: bool = False):
    """A BPE tokenizer trained on WebShop-like text (so words merge into few tokens, as in the real build);
    ``bracket_words``: a query's first word is the instruction's token, as ``model=tiny`` builds it for WebShop."""
    from progpo.models.tiny import train_tokenizer

    corpus = [
        f"Task: {INSTRUCTION}\nNow: WebShop [SEP] Instruction: [SEP] {INSTRUCTION} [SEP] Search\nActions: search[<query>]",
        "<action>search[waterproof shock proof phone case]</action>",
        "<action>search[phone case]</action>",
        "<action>click[b0abcdefgh]</action> <action>click[buy now]</action> <action>click[navy]</action>",
    ] * 3
    return train_tokenizer(corpus, vocab_size=600, max_context=1024, bracket_words=bracket_words)


def _policy(bracket_words: bool = False) -> Policy:
    """A randomly initialised tiny Qwen2: its preferences are arbitrary, so only the grammar makes queries valid."""
    from progpo.models.tiny import tiny_qwen2

    tok = _tokenizer(bracket_words)
    model = tiny_qwen2(tok, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_context=1024,
                       seed=0)
    return Policy(model=model, tokenizer=tok, name="random-tiny", max_context=1024, source="test")


def _complete_answers(space: AnswerSpace, eos: int, prefix: list[int] | None = None) -> list[list[int]]:
    """Every token sequence the grammar lets the sampler write (depth-first; finite thanks to the budget)."""
    prefix = prefix or []
    allowed = space.next_ids(prefix)
    assert allowed is not None, "no free position in the instruction mode"
    if prefix and prefix[-1] == eos:
        return [prefix]
    out = []
    for token in allowed:
        out += _complete_answers(space, eos, prefix + [token])
    return out


def test_query_words_are_the_instructions_alphanumeric_words():
    assert query_words("I'm looking for x-large, navy: 40.00 dollars") == (
        "i", "m", "looking", "for", "x", "large", "navy", "40", "00", "dollars"
    )


@pytest.mark.parametrize("bracket_words", [False, True])
def test_instruction_grammar_is_every_query_of_instruction_words_as_the_tokenizer_writes_it(bracket_words):
    tok = _tokenizer(bracket_words)
    eos = tok.eos_token_id
    words = ("navy", "phone", "case")
    template = answer_space(tok, (SEARCH_PLACEHOLDER,), eos, " ".join(words), budget=None).templates[0]
    budget = len(template.head) + len(template.close) + 4  # room for a few words: small enough to enumerate
    space = answer_space(tok, (SEARCH_PLACEHOLDER,), eos, " ".join(words), budget=budget)
    answers = _complete_answers(space, eos)
    assert all(len(a) <= budget for a in answers)
    texts = {tok.decode(a[:-1]) for a in answers}
    # brute force: every sequence of the words (repeats allowed) whose canonical tokenization fits the budget
    expected, frontier = set(), [[]]
    while frontier:
        seq = frontier.pop()
        for w in words:
            query = [*seq, w]
            ids = tok(f"{ACTION_OPEN}search[{' '.join(query)}]{ACTION_CLOSE}", add_special_tokens=False)["input_ids"]
            if len(ids) + 1 <= budget:
                expected.add(f"{ACTION_OPEN}search[{' '.join(query)}]{ACTION_CLOSE}")
                frontier.append(query)
    assert texts == expected and len(texts) >= 3 + 9
    # and each answer is that canonical tokenization (what the warm start's labels are)
    for a in answers:
        assert a[:-1] == tok(tok.decode(a[:-1]), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("bracket_words", [False, True])
def test_grammar_mixes_enumerated_commands_and_a_search(bracket_words):
    tok = _tokenizer(bracket_words)
    eos = tok.eos_token_id
    space = answer_space(tok, (SEARCH_PLACEHOLDER, "click[buy now]"), eos, INSTRUCTION, budget=BUDGET)
    first = tok(ACTION_OPEN, add_special_tokens=False)["input_ids"]
    assert space.next_ids([]) == first[:1]
    click = tok(f"{ACTION_OPEN}click[buy now]{ACTION_CLOSE}", add_special_tokens=False)["input_ids"] + [eos]
    for t in range(len(click)):
        assert click[t] in space.next_ids(click[:t])
    assert space.next_ids(click) == [eos]  # off every answer: eos, as the trie does


@pytest.mark.parametrize("bracket_words", [False, True])
@pytest.mark.parametrize("query", ["instruction", "free"])
def test_constrained_search_logprobs_match_a_plain_loop_over_full_logits(query, bracket_words):
    policy = _policy(bracket_words)
    tok = policy.tokenizer
    prompt_text = f"Task: {INSTRUCTION}\nNow: WebShop [SEP] Search\nActions: search[<query>]"
    prompts = [tok(prompt_text, add_special_tokens=False)["input_ids"]] * 6
    engine = HFEngine(policy, temperature=1.0, max_new_tokens=BUDGET, constrain_to_admissible=True, query=query)
    torch.manual_seed(0)
    gen = engine.generate(prompts, admissible=[(SEARCH_PLACEHOLDER,)] * 6, task_texts=[INSTRUCTION] * 6)
    words = set(query_words(INSTRUCTION))
    model = policy.model.eval()
    for prompt, ids, lps, allowed, text in zip(prompts, gen.response_ids, gen.logprobs, gen.allowed_token_ids,
                                               gen.texts):
        assert len(ids) == len(lps) == len(allowed) <= BUDGET
        if query == "instruction":
            # a valid search of the instruction's words, every position constrained
            assert all(a is not None for a in allowed)
            action = extract_action(text)
            assert action is not None and resolve_action(action, True, ()) == action
            assert set(action[len("search[") : -1].split()) <= words
            assert text.endswith(ACTION_CLOSE)
        else:
            assert any(a is None for a in allowed)  # the query's tokens are free
        # the plain loop: full logits at each position, masked to the ids allowed there, renormalised
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ids)]
        for t, (token, lp, ok) in enumerate(zip(ids, lps, allowed)):
            row = logits[t].float()
            if ok is not None:
                assert token in ok
                keep = torch.zeros_like(row, dtype=torch.bool)
                keep[ok] = True
                row = row.masked_fill(~keep, -torch.inf)
            assert lp == pytest.approx(F.log_softmax(row, -1)[token].item(), abs=1e-4), (t, query)


def test_free_query_is_closed_within_the_budget():
    policy = _policy()
    tok = policy.tokenizer
    prompts = [tok("Actions: search[<query>]", add_special_tokens=False)["input_ids"]] * 8
    engine = HFEngine(policy, max_new_tokens=12, constrain_to_admissible=True, query="free")
    torch.manual_seed(3)
    gen = engine.generate(prompts, admissible=[(SEARCH_PLACEHOLDER,)] * 8, task_texts=[INSTRUCTION] * 8)
    closed = [t for t in gen.texts if t.endswith(f"]{ACTION_CLOSE}")]
    assert closed, gen.texts  # a random model rarely writes "]" itself: the budget forces ]</action>
    assert all(len(ids) <= 12 for ids in gen.response_ids)
    assert all(t.startswith(f"{ACTION_OPEN}search") for t in gen.texts)


def test_without_an_instruction_the_query_is_free_and_a_bad_mode_is_refused():
    tok = _tokenizer()
    space = answer_space(tok, (SEARCH_PLACEHOLDER,), tok.eos_token_id, None, budget=BUDGET)
    head = space.templates[0].head
    assert space.next_ids(head) is None
    with pytest.raises(ValueError, match="rollout.engine.query"):
        HFEngine(_policy(), constrain_to_admissible=True, query="words")
