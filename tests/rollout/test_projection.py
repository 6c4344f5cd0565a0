"""project_action: text -> admissible command."""

from __future__ import annotations

import random
import re
import time

import pytest

from progpo.rollout.projection import ProjectedAction, normalize_action, project_action

ADMISSIBLE = ("go to cabinet 1", "take apple 1 from cabinet 1", "put apple 1 in/on drawer 1")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<action>go to cabinet 1</action>", ProjectedAction("go to cabinet 1", True)),
        ("<think>the apple is there</think><action>  Go   To Cabinet 1 \n</action>", ProjectedAction("go to cabinet 1", True)),
        ("<ACTION>take apple 1 from cabinet 1</Action>", ProjectedAction("take apple 1 from cabinet 1", True)),
        ("<action>'put apple 1 in/on drawer 1'</action>", ProjectedAction("put apple 1 in/on drawer 1", True)),
        # the last tag counts: a model that revises its answer ends with the final one
        ("<action>go to cabinet 1</action> no wait <action>take apple 1 from cabinet 1</action>",
         ProjectedAction("take apple 1 from cabinet 1", True)),
        ("<action>fly to the moon</action>", ProjectedAction("fly to the moon", False)),
        ("go to cabinet 1", ProjectedAction(None, False)),
        ("<action>go to cabinet 1", ProjectedAction(None, False)),  # unclosed (cut at max_new_tokens)
        ("", ProjectedAction(None, False)),
        ("<action>go to cabinet 12</action>", ProjectedAction("go to cabinet 12", False)),
    ],
)  # fmt: skip
def test_projection_cases(text, expected):
    assert project_action(text, ADMISSIBLE) == expected


def test_canonical_admissible_string_is_returned():
    assert project_action("<action>LOOK</action>", ("Look",)) == ProjectedAction("Look", True)


def test_unknown_admissible_set_checks_syntax_only():
    assert project_action("<action> search[red  shoes] </action>", ()) == ProjectedAction(
        "search[red shoes]", True
    )
    assert project_action("<action>  </action>", ()) == ProjectedAction("  ", False)
    assert project_action("search[red shoes]", ()) == ProjectedAction(None, False)


def test_text_is_never_executed():
    text = "<action>__import__('os').system('echo hi')</action>"
    assert project_action(text, ADMISSIBLE) == ProjectedAction("__import__('os').system('echo hi')", False)


def test_normalize():
    assert normalize_action('  "Go  to\tX 1" ') == "go to x 1"


# ---------------------------------------------------------------------------------------- linear-time extraction

_REFERENCE_RE = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_PIECES = ("<action>", "</action>", "<ACTION>", "</Action>", "<action", "action>", "</", "<", ">", "/", "a", "go to",
           " ", "\n", "cabinet 1")


def reference_project(text: str, admissible) -> ProjectedAction:
    """The original projection with its regex extraction (quadratic on unclosed tags): the specification."""
    matches = _REFERENCE_RE.findall(text)
    if not matches:
        return ProjectedAction(action=None, valid=False)
    raw = matches[-1]
    key = normalize_action(raw)
    if not admissible:
        return ProjectedAction(action=re.sub(r"\s+", " ", raw).strip(), valid=True) if key else ProjectedAction(raw, False)
    for command in admissible:
        if normalize_action(command) == key:
            return ProjectedAction(action=command, valid=True)
    return ProjectedAction(action=raw, valid=False)


@pytest.mark.parametrize("admissible", [ADMISSIBLE, ()])
def test_projection_equals_the_regex_version_on_random_texts(admissible):
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        assert project_action(text, admissible) == reference_project(text, admissible), repr(text)


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("", ProjectedAction(None, False)),
        ("cut at max_new_tokens", ProjectedAction(None, False)),
        ("</action> <action>go to cabinet 1</action>", ProjectedAction("go to cabinet 1", True)),
    ],
)
def test_many_unclosed_action_tags_take_linear_time(tail, expected):
    text = "<action>" * 100_000 + tail  # the regex version took over 60 s on this
    started = time.perf_counter()
    projected = project_action(text, ADMISSIBLE)
    elapsed = time.perf_counter() - started
    assert projected == expected
    assert elapsed < 10.0, f"{elapsed:.2f}s for 100,000 unclosed <action> tags"
