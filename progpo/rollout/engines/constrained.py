"""Decoding constrained to the admissible commands: a token trie per prompt as a logits processor.

An option for small models trained from scratch (``model=tiny``): they learn *which* command to pick long
before they learn to spell every command of every room, and a prefix constraint lets RL work on the first.
Pretrained models (and the paper's setup) decode freely; the env then penalises invalid commands.
Commands that contain a placeholder such as WebShop's ``search[<query>]`` cannot be enumerated: a prompt
with one is decoded freely.

The constrained policy is the one that acts, so it is also the one that is trained: the engine reports, for
every generated token, the token ids the trie allowed at that position (``AdmissibleTrie.per_position``), and
log-probs everywhere (sampling, old, reference, current) are those of the model's distribution renormalised
over the allowed ids (``forward_logprobs(..., allowed=...)``). Training on the unconstrained log-probs instead
moves probability onto tokens the sampler can never pick (a negative advantage pushes the chosen command down
against every other token of the vocabulary), so the acting policy drifts without the PPO ratio seeing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

from progpo.masks import allowed_mask
from progpo.rollout.projection import ACTION_CLOSE, ACTION_OPEN


def allowed_sequences(tokenizer, admissible: Sequence[str], eos_id: int) -> list[list[int]] | None:
    """Token ids of every full answer ``<action>cmd</action><eos>``; None when the set cannot be enumerated."""
    if not admissible or any("<" in a and ">" in a for a in admissible):
        return None
    return [
        tokenizer(f"{ACTION_OPEN}{a}{ACTION_CLOSE}", add_special_tokens=False)["input_ids"] + [eos_id]
        for a in admissible
    ]


def next_tokens(options: Sequence[Sequence[int]], prefix: Sequence[int], eos_id: int) -> list[int]:
    """Ids that keep ``prefix`` on some allowed answer (sorted); eos once an answer is complete or left."""
    t = len(prefix)
    prefix = list(prefix)
    allowed = {seq[t] for seq in options if len(seq) > t and list(seq[:t]) == prefix}
    return sorted(allowed) if allowed else [eos_id]


class AdmissibleTrie(LogitsProcessor):
    """Masks every token that would leave the set of allowed answers of its row (rows with None are free).

    It keeps what it allowed at every generation step (``steps`` and ``masks``, one entry per call), so the
    engine reports the allowed ids and the constrained log-probs without walking the trie again. Each row keeps the
    answers its prefix is still on and narrows them by the one token generated since the last call, so a step
    costs O(answers) per row, not O(answers x length) (``next_tokens`` is the plain definition it equals).
    """

    def __init__(self, allowed: list[list[list[int]] | None], prompt_width: int, eos_id: int) -> None:
        self.allowed = allowed
        self.prompt_width = prompt_width
        self.eos_id = eos_id
        self.steps: list[list[list[int] | None]] = []  # [step][row] allowed ids (None: free row)
        self.masks: list[torch.Tensor] = []  # [step] [rows, V] bool
        self._alive: list[list[int] | None] = [list(range(len(o))) if o is not None else None for o in allowed]
        self._generated = 0  # tokens generated when _alive was last narrowed

    def _narrow(self, input_ids: torch.LongTensor) -> int:
        generated = input_ids.shape[1] - self.prompt_width
        if generated == self._generated + 1:  # the usual case: one new token per row since the last call
            last = input_ids[:, -1].tolist()
            t = self._generated
            self._alive = [
                [k for k in alive if len(options[k]) > t and options[k][t] == last[row]] if alive is not None else None
                for row, (options, alive) in enumerate(zip(self.allowed, self._alive))
            ]
        elif generated != self._generated:  # anything else: from the full prefixes
            prefixes = input_ids[:, self.prompt_width :].tolist()
            self._alive = [
                [k for k, seq in enumerate(options) if len(seq) >= generated and list(seq[:generated]) == prefix]
                if options is not None else None
                for options, prefix in zip(self.allowed, prefixes)
            ]
        self._generated = generated
        return generated

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        t = self._narrow(input_ids)
        step = []
        for options, alive in zip(self.allowed, self._alive):
            if options is None:
                step.append(None)
                continue
            ids = {options[k][t] for k in alive if len(options[k]) > t}
            step.append(sorted(ids) if ids else [self.eos_id])
        mask = allowed_mask(step, scores.shape[-1], scores.device)
        self.steps.append(step)
        self.masks.append(mask)
        return scores.masked_fill(~mask, float("-inf"))

    def per_position(self, row: int, length: int) -> list[list[int]] | None:
        """The ids allowed at each of the first ``length`` generated positions of ``row`` (None: free row)."""
        if self.allowed[row] is None:
            return None
        return [self.steps[t][row] for t in range(length)]
