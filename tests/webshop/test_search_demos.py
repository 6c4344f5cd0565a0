"""Warm-start demos on the shop include the expert's searches, labelled with its query, on the decoding grammar."""

from __future__ import annotations

import pytest

from envs.webshop.actions import SEARCH_PLACEHOLDER, resolve_action
from progpo.config.groups import WarmStartConfig
from progpo.rollout.engines.constrained import answer_space
from progpo.rollout.projection import fills_placeholder, query_words
from progpo.warmstart.demos import _canonical, collect_demos, response_text

from .helpers import suite


def test_placeholder_labels_are_canonical_and_enumerated_ones_still_match():
    assert fills_placeholder("search[Red  Shampoo]", SEARCH_PLACEHOLDER)
    assert not fills_placeholder("search[]", SEARCH_PLACEHOLDER)
    assert not fills_placeholder("search[<query>]", SEARCH_PLACEHOLDER)
    assert not fills_placeholder("click[red]", SEARCH_PLACEHOLDER)
    assert not fills_placeholder("look", "look")
    assert _canonical("search[red  shampoo]", (SEARCH_PLACEHOLDER,)) == "search[red shampoo]"
    assert _canonical("click[Buy Now]", ("click[buy now]",)) == "click[buy now]"
    assert _canonical("click[sell]", ("click[buy now]",)) is None


def test_demos_label_the_experts_search_with_its_query_from_the_instruction():
    shop = suite()
    demos, stats = collect_demos(shop, WarmStartConfig(n_episodes=12, seed=0))
    searches = [d for d in demos if d.admissible == (SEARCH_PLACEHOLDER,)]
    assert stats.skipped_inadmissible == 0
    assert len(searches) >= 12  # every episode starts on the search page: its first label is a search
    goals = {t.payload["goal"]["instruction_text"]: t.payload["goal"] for t in shop.train_tasks[:12]}
    for d in searches:
        assert d.expert_action.startswith("search[") and d.expert_action.endswith("]")
        assert resolve_action(d.expert_action, True, ()) == d.expert_action  # a valid search
        query = d.expert_action[len("search[") : -1]
        goal = goals[d.task_description]
        assert query in (" ".join([*goal["attributes"], goal["query"]]), goal["query"])  # the expert's query
        assert set(query.split()) <= set(query_words(d.task_description))  # drawn from the instruction
    assert stats.won >= 10


@pytest.mark.slow  # trains a BPE tokenizer on the demos' prompts (seconds idle, a minute on a loaded 2-core box)
@pytest.mark.parametrize("bracket_words", [False, True])
def test_search_labels_are_answers_of_the_constrained_grammar(bracket_words):
    """The warm start teaches exactly the token ids constrained decoding allows (no mass on masked ids)."""
    budget = 40  # a 512-token vocabulary splits words more than the real build's 4096 does
    from progpo.models.tiny import train_tokenizer
    from progpo.warmstart.tiny import _corpus

    demos, _ = collect_demos(suite(), WarmStartConfig(n_episodes=8, seed=1))
    tok = train_tokenizer(_corpus(demos, 1), vocab_size=512, max_context=2048, bracket_words=bracket_words)
    eos = tok.eos_token_id
    searches = [d for d in demos if d.admissible == (SEARCH_PLACEHOLDER,)]
    assert searches
    for d in searches:
        target = tok(response_text(d.expert_action), add_special_tokens=False)["input_ids"] + [eos]
        space = answer_space(tok, d.admissible, eos, d.task_description, budget=budget)
        assert len(target) <= budget
        for t, token in enumerate(target):
            assert token in space.next_ids(target[:t]), (d.expert_action, t)
