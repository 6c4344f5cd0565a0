"""Generation on the actor itself with transformers models (no copy, so no weight sync).

The CPU default and the reference implementation the vLLM engine is checked against. Prompts are sorted
by length (identical ones side by side, so each is prefilled once) and left-padded in batches, so a batch
holds only the prompts of still-active envs and wastes little padding; each sequence stops at eos or as soon
as its text contains a stop string. The decoding loop is ``progpo.rollout.engines.kv_decoding`` (forced
tokens of constrained answers cost no model call).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Literal

import torch

from progpo.hardware import auto_batch_rows, is_batch_rows
from progpo.models.attention import cpu_bf16_autocast
from progpo.rollout.engines.base import DEFAULT_MAX_NEW_TOKENS, DEFAULT_STOP, Generation, check_sampling
from progpo.rollout.engines.constrained import AnswerCursor, AnswerSpace, QueryMode, answer_space, check_query
from progpo.rollout.engines.kv_decoding import DecodedRow, Sampling, StopRule, decode
from progpo.rollout.projection import ACTION_OPEN
from progpo.types import Policy

log = logging.getLogger(__name__)


def eos_token_ids(tokenizer, model) -> list[int]:
    """All ids that end a reply: the tokenizer's eos plus the model's generation-config eos ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos is not None:
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ValueError("the tokenizer has no eos token: set tokenizer.eos_token before generating")
    return sorted(ids)


class HFEngine:
    """Generation on the shared actor (a transformers causal LM), with the KV-cache loop of ``kv_decoding``.

    Args:
        policy: the actor; generation runs on ``policy.model`` in eval mode under ``torch.no_grad()``
            (not inference mode: its tensors must stay usable by autograd elsewhere).
        temperature, top_p, top_k: sampling parameters (top_k=0 disables top-k). The model's own
            generation config (e.g. Qwen's repetition penalty) is ignored on purpose.
        max_new_tokens: response budget per step.
        batch_size: prompts decoded together (copies of one prompt share its prefill). The prompts are sorted by
            length first, so smaller batches pad less. ``auto``: 64 when a call runs on an AMX-BF16 CPU under bf16
            autocast, else 32 (``progpo.hardware.auto_batch_rows``; on a 2-core AVX2 laptop 32 decodes faster than 16
            or 64, with AMX in bf16 64 faster than 32: ``docs/guide/speed-cpu.md``).
        stop: strings that end a response (included in it); the answer format ends with ``</action>``.
        constrain_to_admissible: decode only answers ``<action>cmd</action>`` with ``cmd`` admissible (when
            the collector passes the admissible commands); reported log-probs are then those of the model's
            distribution renormalised over the allowed ids (``Generation.allowed_token_ids``). None (default) =
            the policy's own preference (``model=tiny`` and ``smollm2-135m``: on; Qwen: off, the paper's setup).
        reasoning_tokens: with constrained decoding, up to this many freely sampled tokens first (the paper
            prompt's ``<think>`` part; it ends early where the model writes ``<action>``), then the constrained
            ``<action>cmd</action>`` with the rest of ``max_new_tokens``. Free positions train on the full
            distribution, constrained ones on the renormalised one. 0 = the answer is constrained from its first token.
        query: constrained only: how a placeholder command such as ``search[<query>]`` is filled: ``instruction``
            (words of the task's instruction, ``generate(task_texts=...)``) or ``free`` (any tokens until ``]``);
            see ``progpo.rollout.engines.constrained``.
    """

    def __init__(
        self,
        policy: Policy,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        batch_size: int | Literal["auto"] = "auto",
        stop: Sequence[str] = DEFAULT_STOP,
        constrain_to_admissible: bool | None = None,
        reasoning_tokens: int = 0,
        query: QueryMode = "instruction",
    ) -> None:
        check_sampling(temperature, top_p, top_k, max_new_tokens)
        if constrain_to_admissible is None:
            constrain_to_admissible = getattr(policy, "constrain_to_admissible", False)
        self.constrain_to_admissible = bool(constrain_to_admissible)
        if not is_batch_rows(batch_size):
            raise ValueError(f"rollout.engine.batch_size must be an int >= 1 or auto, got {batch_size!r}")
        if not 0 <= reasoning_tokens < max_new_tokens:
            raise ValueError(
                f"rollout.engine.reasoning_tokens must be in [0, max_new_tokens={max_new_tokens}) so that the "
                f"constrained <action> has room, got {reasoning_tokens}"
            )
        self.reasoning_tokens = int(reasoning_tokens)
        check_query(query)
        self.query = query
        self.policy = policy
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = batch_size
        self.stop = tuple(stop)
        tok = policy.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos_ids = eos_token_ids(tok, policy.model)

    def generate(
        self,
        prompts: list[list[int]],
        greedy: bool = False,
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
        task_texts: Sequence[str] | None = None,
    ) -> Generation:
        """Generate one response per prompt (order kept); prompts are token ids from ``PromptBuilder``.

        ``admissible`` (one list per prompt) and ``task_texts`` (each prompt's task instruction, the words a
        constrained search query may use) are used only with ``constrain_to_admissible``. ``temperature``
        overrides the engine's sampling temperature for this call (sampled evaluation).
        """
        if not prompts:
            return Generation()
        temperature = self.temperature if temperature is None else float(temperature)
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling (use greedy=True for 0), got {temperature}")
        limit = self.policy.max_context - self.max_new_tokens
        longest = max(len(p) for p in prompts)
        if longest > limit:
            raise ValueError(
                f"a prompt has {longest} tokens but max_context - max_new_tokens = {limit} for "
                f"{self.policy.name}: set rollout.max_prompt_tokens <= {limit} (or null)"
            )
        if min(len(p) for p in prompts) == 0:
            raise ValueError("got an empty prompt")
        model = self.policy.model
        was_training = model.training
        model.eval()
        started = time.perf_counter()
        results: list[DecodedRow | None] = [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))  # copies side by side
        try:
            with torch.no_grad():
                batch_rows = self.batch_rows(model)
                for start in range(0, len(order), batch_rows):
                    rows = order[start : start + batch_rows]
                    allowed = None
                    if self.constrain_to_admissible and admissible is not None:
                        tok = self.policy.tokenizer
                        budget = self.max_new_tokens - self.reasoning_tokens
                        allowed = [answer_space(tok, admissible[i], self.eos_ids[0],
                                                task_texts[i] if task_texts is not None else None, budget, self.query)
                                   for i in rows]
                    generate = self._generate_reasoned if allowed and self.reasoning_tokens else self._generate_batch
                    batch = generate([prompts[i] for i in rows], greedy, temperature, allowed)
                    for row, result in zip(rows, batch):
                        results[row] = result
        finally:
            model.train(was_training)
        ids = [r.ids for r in results]
        n_tokens = sum(len(r) for r in ids)
        elapsed = time.perf_counter() - started
        log.debug("generated %d tokens for %d prompts in %.2fs", n_tokens, len(prompts), elapsed)
        # The log-probs are the actor's own (temperature 1; greedy reports temperature-1 ones): hand over the
        # prefill's prompt embeddings too, so scoring can skip recomputing both.
        actor_exact = greedy or temperature == 1.0
        return Generation(
            response_ids=ids,
            texts=self.policy.tokenizer.batch_decode(ids, skip_special_tokens=True),
            logprobs=[r.logprobs for r in results],
            n_generated_tokens=n_tokens,
            allowed_token_ids=[r.allowed for r in results],
            prompt_hidden=[r.prompt_hidden for r in results] if actor_exact else [],
        )

    def batch_rows(self, model: torch.nn.Module) -> int:
        """Prompts per decoding call: ``batch_size``, or for ``auto`` the rule for this call's device and precision."""
        if self.batch_size != "auto":
            return self.batch_size
        cuda = next(model.parameters()).device.type == "cuda"
        return auto_batch_rows("bf16-mixed" if cpu_bf16_autocast() else "32-true", cuda)

    def _generate_reasoned(
        self, prompts: list[list[int]], greedy: bool, temperature: float, allowed: list[AnswerSpace | None]
    ) -> list[DecodedRow]:
        """Free reasoning (up to ``reasoning_tokens``, cut before ``<action>``), then the constrained answer.

        Rows whose commands cannot be enumerated (``allowed[i]`` is None) are decoded freely in one call."""
        out: list = [None] * len(prompts)
        free = [i for i, options in enumerate(allowed) if options is None]
        if free:
            for i, result in zip(free, self._generate_batch([prompts[i] for i in free], greedy, temperature)):
                out[i] = result
        rows = [i for i, options in enumerate(allowed) if options is not None]
        thoughts = self._generate_batch([prompts[i] for i in rows], greedy, temperature, None,
                                        self.reasoning_tokens, (ACTION_OPEN,))
        kept = [self._before_action(thought.ids) for thought in thoughts]
        answers = self._generate_batch([prompts[i] + ids for i, ids in zip(rows, kept)], greedy, temperature,
                                       [allowed[i] for i in rows], self.max_new_tokens - self.reasoning_tokens)
        for i, ids, thought, answer in zip(rows, kept, thoughts, answers):
            # The prompt embedding is the thoughts call's: its prefill ended on the prompt's last token.
            out[i] = DecodedRow(ids + answer.ids, thought.logprobs[: len(ids)] + answer.logprobs,
                                [None] * len(ids) + answer.allowed, thought.prompt_hidden)
        return out

    def _before_action(self, ids: list[int]) -> list[int]:
        """The free tokens up to (not including) the one that starts writing ``<action>``, without eos."""
        tok = self.policy.tokenizer
        n = len(ids)
        while n and (ids[n - 1] in self.eos_ids or ACTION_OPEN in tok.decode(ids[:n])):
            n -= 1
        return ids[:n]

    def _generate_batch(
        self,
        prompts: list[list[int]],
        greedy: bool,
        temperature: float,
        allowed: list[AnswerSpace | None] | None = None,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> list[DecodedRow]:
        cursors = [AnswerCursor(a) if a is not None else None for a in allowed] if allowed is not None else None
        return decode(
            self.policy.model, prompts, cursors or [None] * len(prompts),
            Sampling(greedy, temperature, self.top_p, self.top_k), max_new_tokens or self.max_new_tokens,
            StopRule(self.policy.tokenizer, self.stop if stop is None else stop, self.eos_ids), self.pad_id,
        )

    def sync_weights(self, model) -> None:
        """No-op: this engine generates with the actor itself."""

    def close(self) -> None:
        """Nothing to release."""
