"""Decoding constrained to the admissible commands: a token grammar per prompt as a logits processor.

An option for small models trained from scratch (``model=tiny``): they learn *which* command to pick long
before they learn to spell every command of every room, and a prefix constraint lets RL work on the first.
Pretrained models (and the paper's setup) decode freely; the env then penalises invalid commands.

Enumerable commands (``click[buy now]``, ``go to desk 1``) form a token trie. A command holding a placeholder,
such as WebShop's ``search[<query>]``, cannot be enumerated; it is decoded as ``<action>search[`` + query +
``]</action>``, the query's tokens chosen by ``query`` (``rollout.engine.query``):

- ``instruction`` (default): a sequence of words of the task's instruction (``query_words``), each word
  spelled by its own tokens (as the tokenizer writes it in that place, so the warm start's labels are on the
  grammar), ``]`` allowed after any whole word, within the response budget. The tiny model learns to copy
  the right words; every query it writes is a valid search.
- ``free``: the query's tokens are unconstrained (the full vocabulary) until the text closes with ``]``;
  ``]</action>`` is forced when the budget runs out. A position there is free (``None``), as reasoning is.

Measured on the first step of 40 held-out shop goals (2 samples each, T=1, the warm start of
``experiment=webshop_laptop``): ``instruction`` wrote a valid search 100% of the time (the goal product in the
50 hits 14%), ``free`` 5% (0%): the tiny model spells the instruction's words far worse than it picks them, so
``instruction`` is the default (docs/guide/webshop.md).

The constrained policy is the one that acts, so it is also the one that is trained: the engine reports, for
every generated token, the token ids the grammar allowed at that position (``AnswerCursor.allowed``;
``None`` at a free position), and log-probs everywhere (sampling, old, reference, current) are those of the
model's distribution renormalised over the allowed ids (``forward_logprobs(..., allowed=...)``). Training on
the unconstrained log-probs instead moves probability onto tokens the sampler can never pick (a negative
advantage pushes the chosen command down against every other token of the vocabulary), so the acting policy
drifts without the PPO ratio seeing it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Literal

from progpo.rollout.projection import ACTION_CLOSE, ACTION_OPEN, PLACEHOLDER, has_placeholder, query_words

QueryMode = Literal["instruction", "free"]
QUERY_MODES: tuple[str, ...] = ("instruction", "free")


def check_query(query: str) -> None:
    if query not in QUERY_MODES:
        raise ValueError(f"rollout.engine.query must be one of {QUERY_MODES}, got {query!r}")


def allowed_sequences(tokenizer, admissible: Sequence[str], eos_id: int) -> list[list[int]] | None:
    """Token ids of every full answer ``<action>cmd</action><eos>``; None when the set cannot be enumerated."""
    if not admissible or any(has_placeholder(a) for a in admissible):
        return None
    return [_answer_ids(tokenizer, a, eos_id) for a in admissible]


def _answer_ids(tokenizer, command: str, eos_id: int) -> list[int]:
    """``<action>command</action><eos>`` as ids; cached, since every step of every rollout lists the room's commands
    again (tokenising them was 3% of a rollout)."""
    def build() -> tuple[int, ...]:
        return (*tokenizer(f"{ACTION_OPEN}{command}{ACTION_CLOSE}", add_special_tokens=False)["input_ids"], eos_id)

    return list(_memoised(tokenizer, ("answer", command, eos_id), build))


CACHE_LIMIT = 65536  # entries per tokenizer; past it the memo starts over (a WebShop run meets ~10^4 commands)
_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_of(tokenizer) -> dict:
    """The memo of one tokenizer's answer ids and placeholder commands. Held weakly, so it goes with the tokenizer
    (no tokenizer kept alive, no id reused by a new one); a tokenizer that cannot be weakly referenced gets none."""
    try:
        cache = _CACHES.setdefault(tokenizer, {})
    except TypeError:
        return {}
    if len(cache) > CACHE_LIMIT:
        cache.clear()
    return cache


def _memoised(tokenizer, key: tuple, build):
    """``build()`` once per (tokenizer, key). A memoised value must not hold the tokenizer strongly: the weak key
    would then never die (hence the proxy in ``_placeholder_command``)."""
    cache = _cache_of(tokenizer)
    if key not in cache:
        cache[key] = build()
    return cache[key]


def next_tokens(options: Sequence[Sequence[int]], prefix: Sequence[int], eos_id: int) -> list[int]:
    """Ids that keep ``prefix`` on some allowed answer (sorted); eos once an answer is complete or left."""
    return sorted(_trie_next(options, prefix)) or [eos_id]


def _trie_next(options: Sequence[Sequence[int]], prefix: Sequence[int]) -> set[int]:
    t = len(prefix)
    prefix = list(prefix)
    return {seq[t] for seq in options if len(seq) > t and list(seq[:t]) == prefix}


class _PieceTrie:
    """Words as token pieces in a trie; ``left[node]`` = fewest tokens from ``node`` to the end of a word."""

    def __init__(self, pieces: Sequence[Sequence[int]]) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.terminal: list[bool] = [False]
        for piece in pieces:
            node = 0
            for token in piece:
                if token not in self.children[node]:
                    self.children[node][token] = len(self.children)
                    self.children.append({})
                    self.terminal.append(False)
                node = self.children[node][token]
            if node:
                self.terminal[node] = True
        self.left = [0] * len(self.children)
        for node in reversed(range(len(self.children))):  # children have larger ids than their parent
            kids = self.children[node].values()
            self.left[node] = 0 if self.terminal[node] else min((1 + self.left[c] for c in kids), default=10**9)


class PlaceholderCommand:
    """The answers ``<action>{before}{query}{after}</action><eos>`` of one command such as ``search[<query>]``.

    ``head`` is the tokens every answer starts with (``<action>search``: the opening bracket may merge with
    the first word, so it belongs to the first word's piece); ``close`` is ``]</action>`` and eos.
    ``words`` = None: a free query (``query=free``).
    """

    def __init__(self, tokenizer, command: str, eos_id: int, words: Sequence[str] | None,
                 budget: int | None) -> None:
        before, after = PLACEHOLDER.split(command, maxsplit=1)
        self.tokenizer = tokenizer
        self.after = after
        self.budget = budget
        encode = functools.partial(tokenizer, add_special_tokens=False)
        self.close = encode(f"{after}{ACTION_CLOSE}")["input_ids"] + [eos_id]
        self.tail = encode(ACTION_CLOSE)["input_ids"] + [eos_id]  # after a free query closed by the model
        words = [w for w in (words or ()) if w] if words is not None else None
        probes = [*(words or ()), "0", "x"]  # two probes: a lone word would otherwise be all head
        firsts = [encode(f"{ACTION_OPEN}{before}{w}")["input_ids"] for w in probes]
        head = firsts[0]
        for ids in firsts[1:]:
            n = 0
            while n < min(len(head), len(ids)) and head[n] == ids[n]:
                n += 1
            head = head[:n]
        self.head = head
        if words is None:
            self.first = self.rest = None
        else:
            self.first = _PieceTrie([ids[len(head) :] for ids in firsts[: len(words)]])
            self.rest = _PieceTrie([encode(f" {w}")["input_ids"] for w in words])

    def feasible(self) -> bool:
        """Whether a whole answer fits the budget."""
        if self.budget is None:
            return True
        shortest = self.first.left[0] if self.first is not None else 1
        return len(self.head) + shortest + len(self.close) <= self.budget

    def next_ids(self, prefix: Sequence[int]) -> set[int] | None:
        """Ids allowed after ``prefix`` (empty: ``prefix`` left this command); None: a free position."""
        n = len(prefix)
        head = self.head
        if n < len(head):
            return {head[n]} if list(prefix) == head[:n] else set()
        if list(prefix[: len(head)]) != head:
            return set()
        remaining = None if self.budget is None else self.budget - n
        if remaining is not None and remaining <= 0:
            return set()
        query = list(prefix[len(head) :])
        if self.first is None:
            return self._free_next(query, remaining)
        return self._words_next(query, remaining)

    def _fits(self, tokens_after: int, remaining: int | None) -> bool:
        return remaining is None or 1 + tokens_after <= remaining

    def _words_next(self, query: list[int], remaining: int | None) -> set[int]:
        close = self.close
        states: set[tuple] = {("w", 0, 0)}  # (word trie: 0 first / 1 rest, node) or ("c", tokens of close done)
        for token in query:
            nxt: set[tuple] = set()
            for state in states:
                if state[0] == "w":
                    trie = self.first if state[1] == 0 else self.rest
                    child = trie.children[state[2]].get(token)
                    if child is not None:
                        nxt.add(("w", state[1], child))
                    if trie.terminal[state[2]]:
                        child = self.rest.children[0].get(token)
                        if child is not None:
                            nxt.add(("w", 1, child))
                        if token == close[0]:
                            nxt.add(("c", 1))
                elif state[1] < len(close) and close[state[1]] == token:
                    nxt.add(("c", state[1] + 1))
            states = nxt
            if not states:
                return set()
        allowed: set[int] = set()
        for state in states:
            if state[0] == "c":
                if state[1] < len(close):
                    allowed.add(close[state[1]])
                continue
            trie = self.first if state[1] == 0 else self.rest
            node = state[2]
            for token, child in trie.children[node].items():
                if self._fits(trie.left[child] + len(close), remaining):
                    allowed.add(token)
            if trie.terminal[node]:
                if self._fits(len(close) - 1, remaining):
                    allowed.add(close[0])
                for token, child in self.rest.children[0].items():
                    if self._fits(self.rest.left[child] + len(close), remaining):
                        allowed.add(token)
        return allowed

    def _free_next(self, query: list[int], remaining: int | None) -> set[int] | None:
        """Free tokens until the text holds ``after`` (then the rest of the close), or the budget forces it."""
        close = self.close
        forced_from = None
        for j in range(len(query) + 1):
            text = self.tokenizer.decode(query[:j], skip_special_tokens=False)
            if self.after in text:  # closed by the model's own token: </action> and eos follow
                tail = self.tail
                done = query[j:]
                if done != tail[: len(done)]:
                    return set()
                return {tail[len(done)]} if len(done) < len(tail) else set()
            left = None if remaining is None else remaining + (len(query) - j)
            if left is not None and left <= len(close):
                forced_from = j
                break
        if forced_from is None:
            return None
        done = query[forced_from:]
        if done != close[: len(done)]:
            return set()
        return {close[len(done)]} if len(done) < len(close) else set()


class AnswerSpace:
    """Every answer allowed for one prompt: enumerated commands (a trie) and placeholder commands."""

    def __init__(self, options: Sequence[Sequence[int]], templates: Sequence[PlaceholderCommand] = (),
                 eos_id: int = 0) -> None:
        self.options = [list(o) for o in options]
        self.templates = list(templates)
        self.eos_id = eos_id

    def next_ids(self, prefix: Sequence[int]) -> list[int] | None:
        """Ids that keep ``prefix`` on some allowed answer (sorted), None at a free position; eos once left."""
        return self.merge(_trie_next(self.options, prefix), prefix)

    def merge(self, enumerated: set[int], prefix: Sequence[int]) -> list[int] | None:
        """The enumerated commands' next ids after ``prefix`` joined with the placeholder commands' (sorted);
        None at a free position; eos when nothing continues ``prefix``."""
        allowed = set(enumerated)
        for template in self.templates:
            ids = template.next_ids(prefix)
            if ids is None:
                return None
            allowed |= ids
        return sorted(allowed) or [self.eos_id]


def answer_space(tokenizer, admissible: Sequence[str], eos_id: int, task_text: str | None = None,
                 budget: int | None = None, query: QueryMode = "instruction") -> AnswerSpace | None:
    """The answers allowed for one prompt; None when there is nothing to constrain to (no admissible list).

    ``task_text``: the task's instruction, whose words a placeholder's query may use (``query=instruction``;
    without it the query is free). ``budget``: the response's token budget, so that every answer closes in it.
    """
    check_query(query)
    if not admissible:
        return None
    words = query_words(task_text) if (query == "instruction" and task_text) else None
    options, templates = [], []
    for command in admissible:
        if has_placeholder(command):
            template = _placeholder_command(tokenizer, command, eos_id, words, budget)
            if template.feasible():
                templates.append(template)
        else:
            options.append(_answer_ids(tokenizer, command, eos_id))
    if not options and not templates:
        return None
    return AnswerSpace(options, templates, eos_id)


def _placeholder_command(tokenizer, command: str, eos_id: int, words: tuple[str, ...] | None,
                         budget: int | None) -> PlaceholderCommand:
    """One per (tokenizer, command, words, budget): the N rollouts of a task and its repeated visits share it."""
    try:
        held = weakref.proxy(tokenizer)  # the command keeps using the tokenizer, but must not keep it alive
    except TypeError:
        held = tokenizer  # not weakly referenceable: ``_cache_of`` memoises nothing for it either
    return _memoised(tokenizer, ("placeholder", command, eos_id, words, budget),
                     lambda: PlaceholderCommand(held, command, eos_id, words, budget))


class AnswerCursor:
    """One row's walk through its answer grammar: the ids allowed next, narrowed by each token taken.

    The decoder asks ``allowed()`` at every generated position and reports ``advance(token)``. It keeps the
    enumerated answers the prefix is still on, so a step costs O(answers), not O(answers x length); placeholder
    commands (``search[...]``) read the whole prefix. ``allowed()`` equals ``AnswerSpace.next_ids`` on the
    prefix walked so far (the plain definition; tested on random grammars and walks), and a position where it
    returns one id is forced: the decoder appends it without a model call (its renormalised log-prob is 0).
    """

    def __init__(self, space: AnswerSpace) -> None:
        self.space = space
        self.prefix: list[int] = []
        self._alive = list(range(len(space.options)))
        self._next: list[int] | None = None
        self._known = False  # whether _next holds the answer for the current prefix

    def allowed(self) -> list[int] | None:
        """Sorted ids allowed at the next position; None at a free position; eos once the answer is complete."""
        if not self._known:
            self._next = self._compute()
            self._known = True
        return self._next

    def _compute(self) -> list[int] | None:
        t = len(self.prefix)
        options = self.space.options
        return self.space.merge({options[k][t] for k in self._alive if len(options[k]) > t}, self.prefix)

    def advance(self, token: int) -> None:
        t = len(self.prefix)
        options = self.space.options
        self._alive = [k for k in self._alive if len(options[k]) > t and options[k][t] == token]
        self.prefix.append(int(token))
        self._known = False
