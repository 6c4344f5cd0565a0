"""PromptBuilder: content, chat template, and truncation from the left of the history."""

from __future__ import annotations

import pytest

from progpo.rollout.prompt import ELLIPSIS, PromptBuilder, PromptStep

TASK = "put some apple in drawer 1."
ADMISSIBLE = ("go to cabinet 1", "go to drawer 1", "look")
PAST = [
    (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1 and a drawer 1.",
        "look",
    ),
    ("You are facing the middle of the room.", "go to cabinet 1"),
    ("You arrive at cabinet 1. On the cabinet 1, you see a apple 1.", "take apple 1 from cabinet 1"),
]
CURRENT = "You pick up the apple 1 from the cabinet 1."


def test_prompt_has_task_last_k_pairs_current_observation_and_admissible(tokenizer):
    prompt = PromptBuilder(tokenizer, history=2).build(TASK, CURRENT, ADMISSIBLE, PAST)
    text = prompt.text
    assert TASK in text and CURRENT in text
    assert "['go to cabinet 1', 'go to drawer 1', 'look']" in text
    assert PAST[0][0] not in text  # only the last K=2 pairs
    assert text.index(PAST[1][0]) < text.index(PAST[2][0]) < text.index(CURRENT)
    assert "[Observation 2: 'You are facing the middle of the room.', Action 2: 'go to cabinet 1']" in text
    assert "already taken 3 step(s)" in text and "now at step 4" in text
    assert "<action> </action>" in text
    assert prompt.n_history_used == 2 and not prompt.truncated


def test_prompt_is_rendered_with_the_chat_template(tokenizer):
    prompt = PromptBuilder(tokenizer).build(TASK, CURRENT, ADMISSIBLE, [])
    assert prompt.text.startswith("<|im_start|>user\n")
    assert prompt.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.ids == tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    assert (
        "Prior to this step" not in prompt.text and "Your current observation is: " + CURRENT in prompt.text
    )


def test_history_zero_and_empty_admissible(tokenizer):
    prompt = PromptBuilder(tokenizer, history=0).build(TASK, CURRENT, (), PAST)
    assert prompt.n_history_used == 0 and not prompt.truncated
    assert "already taken 3 step(s)." in prompt.text and PAST[2][0] not in prompt.text
    assert "admissible actions of the current situation" not in prompt.text


def _lengths(tokenizer, k):
    return [
        len(PromptBuilder(tokenizer, history=k).build(TASK, CURRENT, ADMISSIBLE, PAST).ids)
        for k in range(k + 1)
    ]


def test_too_long_prompt_drops_the_oldest_pairs_first(tokenizer):
    n0, n1, n2, n3 = _lengths(tokenizer, 3)
    builder = PromptBuilder(tokenizer, history=3, max_prompt_tokens=n2)
    prompt = builder.build(TASK, CURRENT, ADMISSIBLE, PAST)
    assert prompt.truncated and prompt.n_history_used == 2
    assert len(prompt.ids) <= n2
    assert PAST[0][0] not in prompt.text and PAST[1][0] in prompt.text and PAST[2][0] in prompt.text
    assert CURRENT in prompt.text and TASK in prompt.text


def test_last_pair_is_shortened_from_the_left_before_being_dropped(tokenizer):
    long_obs = "You arrive at cabinet 1. " + " ".join(f"On shelf {i} you see a mug {i}." for i in range(60))
    past = [("You are in the middle of a room.", "look"), (long_obs, "go to cabinet 1")]
    full = PromptBuilder(tokenizer, history=2).build(TASK, CURRENT, ADMISSIBLE, past)
    bare = PromptBuilder(tokenizer, history=0).build(TASK, CURRENT, ADMISSIBLE, past)
    limit = (len(full.ids) + len(bare.ids)) // 2
    prompt = PromptBuilder(tokenizer, history=2, max_prompt_tokens=limit).build(
        TASK, CURRENT, ADMISSIBLE, past
    )
    assert prompt.truncated and prompt.n_history_used == 1
    assert len(prompt.ids) <= limit
    assert len(prompt.ids) >= limit - 30  # as much of the observation as fits is kept
    assert f"'{ELLIPSIS}" in prompt.text and "mug 59." in prompt.text and "mug 0." not in prompt.text
    assert "Action 2: 'go to cabinet 1'" in prompt.text and CURRENT in prompt.text


def test_history_is_dropped_entirely_when_nothing_of_it_fits(tokenizer):
    n0 = _lengths(tokenizer, 0)[0]
    prompt = PromptBuilder(tokenizer, history=2, max_prompt_tokens=n0).build(TASK, CURRENT, ADMISSIBLE, PAST)
    assert prompt.truncated and prompt.n_history_used == 0 and len(prompt.ids) == n0
    assert CURRENT in prompt.text and "already taken 3 step(s)." in prompt.text


def test_prompt_that_cannot_fit_raises_with_the_config_to_change(tokenizer):
    n0 = _lengths(tokenizer, 0)[0]
    builder = PromptBuilder(tokenizer, history=2, max_prompt_tokens=n0 - 1)
    with pytest.raises(ValueError, match="rollout.max_prompt_tokens"):
        builder.build(TASK, CURRENT, ADMISSIBLE, PAST)


def test_never_longer_than_the_limit(tokenizer):
    n0, _, _, n3 = _lengths(tokenizer, 3)
    for limit in range(n0, n3 + 1, 3):
        prompt = PromptBuilder(tokenizer, history=3, max_prompt_tokens=limit).build(
            TASK, CURRENT, ADMISSIBLE, PAST
        )
        assert len(prompt.ids) <= limit
        assert CURRENT in prompt.text and "'go to drawer 1'" in prompt.text


def test_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="history"):
        PromptBuilder(tokenizer, history=-1)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        PromptBuilder(tokenizer, max_prompt_tokens=0)

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat_template"):
        PromptBuilder(NoTemplate())


def test_compact_style_has_the_same_content_and_truncates_the_same_way(tokenizer):
    paper = PromptBuilder(tokenizer, history=2).build(TASK, CURRENT, ADMISSIBLE, PAST)
    compact = PromptBuilder(tokenizer, history=2, style="compact").build(TASK, CURRENT, ADMISSIBLE, PAST)
    assert len(compact.ids) < len(paper.ids)
    for piece in (TASK, CURRENT, PAST[1][0], PAST[2][1], "go to cabinet 1 | go to drawer 1 | look"):
        assert piece in compact.text
    assert PAST[0][0] not in compact.text and "<think>" not in compact.text
    bare = PromptBuilder(tokenizer, history=0, style="compact").build(TASK, CURRENT, ADMISSIBLE, PAST)
    limit = len(bare.ids) + 5
    cut = PromptBuilder(tokenizer, history=2, max_prompt_tokens=limit, style="compact").build(
        TASK, CURRENT, ADMISSIBLE, PAST
    )
    assert cut.truncated and len(cut.ids) <= limit and CURRENT in cut.text
    with pytest.raises(ValueError, match="style"):
        PromptBuilder(tokenizer, style="verbose")


@pytest.mark.parametrize("style", ["paper", "compact"])
@pytest.mark.parametrize("history", [0, 2])
def test_build_many_equals_build_of_each_step(tokenizer, style, history):
    """One tokenizer call for the steps that fit, build's truncation for those that do not: the same prompts."""
    steps = [PromptStep(TASK, CURRENT, ADMISSIBLE, PAST[:k]) for k in range(len(PAST) + 1)]
    steps += [PromptStep(TASK, "You arrive at drawer 1. " * k, ADMISSIBLE[:k], PAST) for k in range(1, 4)]
    lengths = sorted(len(PromptBuilder(tokenizer, history=history, style=style).build(
        s.task_description, s.observation, s.admissible, s.past).ids) for s in steps)
    bare = max(len(PromptBuilder(tokenizer, history=0, style=style).build(
        s.task_description, s.observation, s.admissible, s.past).ids) for s in steps)
    truncated = 0
    for limit in (None, max(bare, lengths[len(lengths) // 2])):
        builder = PromptBuilder(tokenizer, history=history, max_prompt_tokens=limit, style=style)
        many = builder.build_many(steps)
        one_by_one = [builder.build(s.task_description, s.observation, s.admissible, s.past) for s in steps]
        assert many == one_by_one
        truncated += sum(p.truncated for p in many)
    assert builder.build_many([]) == []
    assert truncated > 0 or history == 0  # the limit made some prompts go through the truncation
