"""Incremental decoding on the actor with a KV cache: each distinct prompt prefilled once, forced tokens not run.

Why not transformers ``generate``: under constrained decoding most generated tokens are forced (the grammar
allows one id: ``<action>``, the rest of a command once it is told apart, ``</action>``; 80% of an ALFWorld
iteration's tokens), and a quarter of one step's prompts repeat (the N rollouts of a task start alike). Here a
forced token is appended without a model call (renormalised over one id, its log-prob is exactly 0), the
tokens appended since the last call go through the model in one block when the next choice needs logits, and
each distinct prompt is prefilled once, its cache copied to its rows. Free rows (no grammar, or a free
position inside one) sample every token, as ``generate`` does. Each model call serves one choice per row.

Sampling at a position: the grammar's mask, then temperature, top-k and top-p, then one draw; the log-prob
reported is that of the temperature-scaled distribution renormalised over the grammar's ids (not the top-k/top-p
truncation), as the scorer computes it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from progpo.masks import allowed_mask
from progpo.models.window import supports_window, window_hidden
from progpo.rollout.engines.constrained import AnswerCursor


@dataclass(frozen=True)
class Sampling:
    """How a choice is made: greedy (argmax, log-probs at temperature 1) or a draw at ``temperature``."""

    greedy: bool
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class DecodedRow:
    """One response: its ids, their log-probs, the ids allowed at each position (None: a free row), and the
    final hidden state of the prompt's last token (the state embedding the credit estimators use)."""

    ids: list[int]
    logprobs: list[float]
    allowed: list[list[int] | None] | None
    prompt_hidden: torch.Tensor


class StopRule:
    """A response ends at an eos id or once its text holds a stop string (the token that completes it included)."""

    def __init__(self, tokenizer, stop: Sequence[str], eos_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.eos = frozenset(int(i) for i in eos_ids)
        # A stop string spans at most len(s) tokens, plus one for a token that starts before it.
        self.tail = max((len(s) for s in self.stop), default=0) + 1

    def ends(self, ids: list[int]) -> bool:
        if ids[-1] in self.eos:
            return True
        if not self.stop:
            return False
        text = self.tokenizer.decode(ids[-self.tail :], skip_special_tokens=False)
        return any(s in text for s in self.stop)


class _Row:
    """A row being decoded: what it generated, how much of it the cache holds, and its grammar (None: free)."""

    def __init__(self, cursor: AnswerCursor | None) -> None:
        self.cursor = cursor
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.allowed: list[list[int] | None] = []
        self.fed = 0  # generated tokens already in the cache; the last logits predict position ``fed``
        self.done = False

    def next_allowed(self) -> list[int] | None:
        return self.cursor.allowed() if self.cursor is not None else None

    def append(self, token: int, logprob: float, allowed: list[int] | None, stop: StopRule, budget: int) -> None:
        self.ids.append(int(token))
        self.logprobs.append(float(logprob))
        self.allowed.append(allowed)
        if self.cursor is not None:
            self.cursor.advance(token)
        self.done = stop.ends(self.ids) or len(self.ids) >= budget

    def walk_forced(self, stop: StopRule, budget: int) -> None:
        """Append every token the grammar forces from here (log-prob 0), up to the next choice or the end."""
        while not self.done:
            allowed = self.next_allowed()
            if allowed is None or len(allowed) != 1:
                return
            self.append(allowed[0], 0.0, allowed, stop, budget)


def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    cursors: Sequence[AnswerCursor | None],
    sampling: Sampling,
    max_new_tokens: int,
    stop: StopRule,
    pad_id: int,
) -> list[DecodedRow]:
    """Decode one response per prompt (order kept) with ``model`` (eval mode, under no_grad: the caller's job)."""
    if not prompts:
        return []
    device = next(model.parameters()).device
    firsts: dict[tuple[int, ...], int] = {}
    source = [firsts.setdefault(tuple(p), len(firsts)) for p in prompts]
    cache, logits, hidden, attention = _prefill(model, list(firsts), pad_id, device)
    index = torch.tensor(source, device=device)
    cache.batch_select_indices(index)
    logits, hidden, attention = logits[index], hidden[index].float().cpu(), attention[index]
    positions = attention.sum(dim=1)  # the next position id of each row
    rows = [_Row(c) for c in cursors]
    in_cache = list(range(len(rows)))  # row of each cache entry
    head = model.get_output_embeddings()
    for row in rows:
        row.walk_forced(stop, max_new_tokens)
    while True:
        choosers = [i for i, r in enumerate(in_cache) if not rows[r].done and rows[r].fed == len(rows[r].ids)]
        if choosers:
            chosen = [rows[in_cache[i]] for i in choosers]
            _choose(chosen, logits[choosers], sampling, stop, max_new_tokens)
            for row in chosen:  # the grammar may force what follows the choice: it goes in the same block
                row.walk_forced(stop, max_new_tokens)
        keep = [i for i, r in enumerate(in_cache) if not rows[r].done]
        if not keep:
            break
        if len(keep) < len(in_cache):
            cache.batch_select_indices(torch.tensor(keep, device=device))
            attention, positions = attention[keep], positions[keep]
            in_cache = [in_cache[i] for i in keep]
        logits, attention, positions = _feed(model, head, cache, [rows[r] for r in in_cache], attention, positions,
                                             pad_id, device)
    return [DecodedRow(r.ids, r.logprobs, r.allowed if r.cursor is not None else None, hidden[i])
            for i, r in enumerate(rows)]


def _decoder_pass(model, input_ids, attention, positions, cache, last: torch.Tensor) -> torch.Tensor:
    """Append the block ``input_ids`` [B, W] to ``cache``; [B, d] final hidden state at block index ``last`` of each
    row. The last layer runs its queries there only where ``progpo.models.window`` knows the decoder."""
    if supports_window(model):
        return window_hidden(model, input_ids, last.unsqueeze(1), attention_mask=attention, position_ids=positions,
                             cache=cache)[:, 0]
    decoder = model.get_decoder()
    kwargs = {_cache_argument(type(decoder)): cache}
    hidden = decoder(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                     **kwargs).last_hidden_state
    return hidden[torch.arange(len(hidden), device=hidden.device), last]


@functools.cache
def _cache_argument(decoder_type: type) -> str:
    """transformers 5.x names the cache ``cache`` (``past_key_values`` is deprecated); 4.x only knows the latter."""
    return "cache" if "cache" in inspect.signature(decoder_type.forward).parameters else "past_key_values"


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W] ids and attention mask of the prompts left-padded to the longest: each ends in the last column."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        attention[i, width - len(p) :] = 1
    return input_ids, attention


def _prefill(model, prompts: list[tuple[int, ...]], pad_id: int, device):
    """Left-padded prefill of the distinct prompts: cache, next-token logits [U, V], last hidden [U, d], mask."""
    input_ids, attention = left_pad(prompts, pad_id)
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    cache = DynamicCache()
    last = torch.full((len(prompts),), input_ids.shape[1] - 1, device=device)
    hidden = _decoder_pass(model, input_ids, attention, positions, cache, last)
    return cache, model.get_output_embeddings()(hidden).float(), hidden, attention


def _feed(model, head, cache, rows: list[_Row], attention, positions, pad_id: int, device):
    """Run each row's tokens not yet in the cache through the model in one right-padded block."""
    pending = [r.ids[r.fed :] for r in rows]
    width = max(len(p) for p in pending)
    block = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.long)
    for i, p in enumerate(pending):
        block[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        real[i, : len(p)] = 1
    block, real = block.to(device), real.to(device)
    attention = torch.cat([attention, real], dim=1)
    lengths = torch.tensor([len(p) for p in pending], device=device)
    last = _decoder_pass(model, block, attention, positions.unsqueeze(1) + torch.arange(width, device=device), cache,
                         lengths - 1)
    for r in rows:
        r.fed = len(r.ids)
    return head(last).float(), attention, positions + lengths


def _choose(rows: list[_Row], logits: torch.Tensor, sampling: Sampling, stop: StopRule, budget: int) -> None:
    """One choice per row from its next-token logits, under its grammar's mask."""
    allowed = [r.next_allowed() for r in rows]
    mask = allowed_mask(allowed, logits.shape[-1], logits.device)
    masked = logits.masked_fill(~mask, -torch.inf)
    temperature = 1.0 if sampling.greedy else sampling.temperature
    logp = F.log_softmax(masked / temperature, dim=-1)
    if sampling.greedy:
        tokens = masked.argmax(dim=-1)
    else:
        tokens = torch.multinomial(_truncate(logp, sampling.top_k, sampling.top_p).exp(), 1).squeeze(1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    for row, token, lp, ids in zip(rows, tokens.tolist(), chosen, allowed):
        row.append(token, lp, ids, stop, budget)


def _truncate(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then nucleus (top-p) truncation of log-probs: dropped ids get -inf; at least one id is kept."""
    if top_k > 0 and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, -torch.inf)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # mass of the ids ranked above
        drop = before >= top_p
        drop[:, 0] = False
        logp = logp.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), -torch.inf)
    return logp
