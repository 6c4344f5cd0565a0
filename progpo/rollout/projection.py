"""Model text -> environment action (verl-agent style projection).

The model answers in free text that ends with ``<action>...</action>``; only that tag's content is
checked against the admissible commands. The text is never executed or evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ACTION_OPEN = "<action>"
ACTION_CLOSE = "</action>"
_ACTION_TAG = re.compile(r"<action>|</action>", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_QUOTES = "\"'`"


@dataclass(frozen=True)
class ProjectedAction:
    """``action`` is the env's canonical command when ``valid``; otherwise the raw extracted text or None."""

    action: str | None
    valid: bool


def normalize_action(text: str) -> str:
    """Case- and whitespace-insensitive form used to compare a model answer with an admissible command."""
    text = _SPACES.sub(" ", text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
        text = text[1:-1].strip()
    return text.lower()


def find_admissible(text: str, admissible: Sequence[str]) -> str | None:
    """The admissible command equal to ``text`` up to case, whitespace and quotes; None when none is."""
    key = normalize_action(text)
    for command in admissible:
        if normalize_action(command) == key:
            return command
    return None


PLACEHOLDER = re.compile(r"<[A-Za-z_]+>")  # a command's free part, e.g. WebShop's search[<query>]
_WORD = re.compile(r"[a-z0-9]+")


def has_placeholder(command: str) -> bool:
    return PLACEHOLDER.search(command) is not None


def query_words(text: str) -> tuple[str, ...]:
    """The words a constrained query may use: lower-cased alphanumeric words of ``text``, first occurrence order.

    The shop's search tokenises the same way (``envs.webshop.search.tokenize``), so splitting ``x-large`` or
    ``40.00`` into words loses nothing a search could use.
    """
    return tuple(dict.fromkeys(_WORD.findall(text.lower())))


def fills_placeholder(text: str, command: str) -> bool:
    """Whether ``text`` is ``command`` with its placeholder (``search[<query>]``) filled by non-empty text.

    Compared up to case and whitespace, as ``find_admissible`` compares; a command without a placeholder never
    matches here."""
    parts = PLACEHOLDER.split(normalize_action(command))
    if len(parts) < 2:
        return False
    pattern = "(.+)".join(re.escape(p) for p in parts)
    m = re.fullmatch(pattern, normalize_action(text), re.DOTALL)
    return m is not None and all(g.strip() and not PLACEHOLDER.fullmatch(g.strip()) for g in m.groups())


def extract_action(text: str) -> str | None:
    """Content of the last closed ``<action>...</action>`` tag, or None when there is none.

    One left-to-right pass over the tags (linear in the text): a tag opens at the first ``<action>`` outside a tag
    and closes at the next ``</action>``, exactly the matches of ``re.findall(r"<action>(.*?)</action>")`` (which
    is quadratic on many unclosed ``<action>`` tags: it rescans the rest of the text from each of them).
    """
    last, opened_at = None, None
    for tag in _ACTION_TAG.finditer(text):
        closing = tag.group().startswith("</")
        if opened_at is None and not closing:
            opened_at = tag.end()
        elif opened_at is not None and closing:
            last, opened_at = text[opened_at : tag.start()], None
    return last


def project_action(text: str, admissible: Sequence[str]) -> ProjectedAction:
    """Project a model response onto the admissible commands.

    The last ``<action>`` tag counts (a model that revises its answer ends with the final one). With an
    empty ``admissible`` (the env cannot list its commands, e.g. a free-text search) any non-empty tag
    content is syntactically valid and returned with its whitespace collapsed.
    """
    raw = extract_action(text)
    if raw is None:
        return ProjectedAction(action=None, valid=False)
    key = normalize_action(raw)
    if not admissible:
        if not key:
            return ProjectedAction(action=raw, valid=False)
        return ProjectedAction(action=_SPACES.sub(" ", raw).strip(), valid=True)
    command = find_admissible(raw, admissible)
    return ProjectedAction(action=command, valid=True) if command else ProjectedAction(action=raw, valid=False)
