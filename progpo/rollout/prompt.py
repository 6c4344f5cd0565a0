"""The agent's prompt: task, last K (observation, action) pairs, current observation, admissible actions.

Follows the paper's (verl-agent) step-level setup: the policy sees a bounded history window instead of
the whole episode, so the context does not grow with the number of turns. The user message is rendered
with the model's own chat template. When a prompt is too long, history is cut from the left (oldest
first) and the cut is reported in ``Prompt.truncated``; the task, the current observation and the
admissible actions are never cut.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_INTRO = "You are an expert agent operating in a text-based interactive environment."
ELLIPSIS = "..."
INSTRUCTION = (
    "Now it's your turn to take an action. You should first reason step-by-step about the current situation "
    "within <think> </think> tags. Once you've finished your reasoning, choose an admissible action for the "
    "current step and present it within <action> </action> tags."
)
INSTRUCTION_FREE = (
    "Now it's your turn to take an action. You should first reason step-by-step about the current situation "
    "within <think> </think> tags. Once you've finished your reasoning, present your action for the current "
    "step within <action> </action> tags."
)


@dataclass(frozen=True)
class PromptStep:
    """What one step's prompt shows (:meth:`PromptBuilder.build`'s arguments)."""

    task_description: str
    observation: str
    admissible: Sequence[str]
    past: Sequence[tuple[str, str]]


@dataclass
class Prompt:
    """A rendered prompt: chat-template text, its token ids, and how much history made it in."""

    text: str
    ids: list[int]
    n_history_used: int  # number of (observation, action) pairs included (a shortened one counts)
    truncated: bool  # True when history was dropped or shortened to fit ``max_prompt_tokens``


def render_user_message(
    task_description: str,
    observation: str,
    admissible: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    n_steps_taken: int,
    intro: str = DEFAULT_INTRO,
) -> str:
    """The user message text. ``pairs`` are the history pairs to show (oldest first), already selected."""
    lines = [f"{intro} Your task is to: {task_description}"]
    if n_steps_taken > 0:
        if pairs:
            first = n_steps_taken - len(pairs) + 1
            lines.append(
                f"Prior to this step, you have already taken {n_steps_taken} step(s). Below are the most recent "
                f"{len(pairs)} observations and the corresponding actions you took:"
            )
            lines.extend(
                f"[Observation {first + i}: '{obs}', Action {first + i}: '{act}']"
                for i, (obs, act) in enumerate(pairs)
            )
        else:
            lines.append(f"Prior to this step, you have already taken {n_steps_taken} step(s).")
        lines.append(
            f"You are now at step {n_steps_taken + 1} and your current observation is: {observation}"
        )
    else:
        lines.append(f"Your current observation is: {observation}")
    if admissible:
        listed = ", ".join(f"'{a}'" for a in admissible)
        lines.append(f"Your admissible actions of the current situation are: [{listed}].")
        lines.append("")
        lines.append(INSTRUCTION)
    else:
        lines.append("")
        lines.append(INSTRUCTION_FREE)
    return "\n".join(lines)


def render_compact_message(
    task_description: str,
    observation: str,
    admissible: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    n_steps_taken: int,
    intro: str = DEFAULT_INTRO,
) -> str:
    """The same content as :func:`render_user_message` without the instructions' boilerplate.

    For small models trained from scratch (``model=tiny``): every prompt token costs compute in rollout and
    update, and a model that never read English gains nothing from the verbose instructions.
    """
    lines = [f"Task: {task_description}"]
    first = n_steps_taken - len(pairs) + 1
    lines.extend(f"Step {first + i}: {obs} > {act}" for i, (obs, act) in enumerate(pairs))
    lines.append(f"Now: {observation}")
    if admissible:
        lines.append("Actions: " + " | ".join(admissible))
    return "\n".join(lines)


PROMPT_STYLES = {"paper": render_user_message, "compact": render_compact_message}


class PromptBuilder:
    """Builds step prompts for one tokenizer.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        history: K, the number of most recent (observation, action) pairs to show (paper: 2).
        max_prompt_tokens: longest prompt allowed, in tokens; None = no limit. The collector passes the
            model's ``max_context - max_new_tokens``.
        intro: first sentence of the message (who the agent is).
        style: ``paper`` (the verl-agent prompt of the paper, default) or ``compact`` (same content, no
            boilerplate; for small models trained from scratch).
    """

    def __init__(
        self,
        tokenizer: Any,
        history: int = 2,
        max_prompt_tokens: int | None = None,
        intro: str = DEFAULT_INTRO,
        style: str = "paper",
    ) -> None:
        if style not in PROMPT_STYLES:
            raise ValueError(f"prompt style must be one of {sorted(PROMPT_STYLES)}, got {style!r}")
        if history < 0:
            raise ValueError(f"history must be >= 0 (number of past pairs in the prompt), got {history}")
        if max_prompt_tokens is not None and max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be > 0 or None, got {max_prompt_tokens}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; PromptBuilder renders prompts "
                "with the model's chat template"
            )
        self.tokenizer = tokenizer
        self.history = history
        self.max_prompt_tokens = max_prompt_tokens
        self.intro = intro
        self.render = PROMPT_STYLES[style]

    def _render(self, *parts: Any) -> tuple[str, list[int]]:
        """:meth:`_text` of ``parts``, and its token ids."""
        text = self._text(*parts)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text, list(ids)

    def _text(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str],
        pairs: Sequence[tuple[str, str]],
        n_taken: int,
    ) -> str:
        content = self.render(task, observation, admissible, pairs, n_taken, self.intro)
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )

    def _pairs(self, past: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        return list(past[-self.history :]) if self.history > 0 else []

    def _fits(self, ids: list[int]) -> bool:
        return self.max_prompt_tokens is None or len(ids) <= self.max_prompt_tokens

    def build(
        self,
        task_description: str,
        observation: str,
        admissible: Sequence[str],
        past: Sequence[tuple[str, str]],
    ) -> Prompt:
        """Render the prompt for the current step.

        ``past`` is the episode's (observation, action) pairs so far, oldest first (the whole episode is
        fine: only the last ``history`` pairs are shown; its length is the step count in the prompt).
        """
        n_taken = len(past)
        pairs = self._pairs(past)
        args = (task_description, observation, admissible)
        text, ids = self._render(*args, pairs, n_taken)
        if self._fits(ids):
            return Prompt(text=text, ids=ids, n_history_used=len(pairs), truncated=False)
        return self._truncated(args, pairs, n_taken)

    def _truncated(
        self, args: tuple[str, str, Sequence[str]], pairs: list[tuple[str, str]], n_taken: int
    ) -> Prompt:
        """The prompt of a step whose ``pairs`` do not fit: history cut from the oldest pair until it does."""
        admissible = args[2]
        bare_text, bare_ids = self._render(*args, [], n_taken)
        if not self._fits(bare_ids):
            raise ValueError(
                f"the prompt needs {len(bare_ids)} tokens without any history (task, current observation and "
                f"{len(admissible)} admissible actions) but max_prompt_tokens={self.max_prompt_tokens}: raise "
                "rollout.max_prompt_tokens (null = model max_context - max_new_tokens), or use a model with a "
                "longer max_context or fewer rollout.engine.max_new_tokens"
            )
        # Drop the oldest pairs while more than one is left.
        while len(pairs) > 1:
            pairs = pairs[1:]
            text, ids = self._render(*args, pairs, n_taken)
            if self._fits(ids):
                return Prompt(text=text, ids=ids, n_history_used=len(pairs), truncated=True)
        if pairs:
            shortened = self._shorten_oldest(args, pairs[0], n_taken)
            if shortened is not None:
                text, ids = shortened
                return Prompt(text=text, ids=ids, n_history_used=1, truncated=True)
        return Prompt(text=bare_text, ids=bare_ids, n_history_used=0, truncated=True)

    def build_many(self, steps: Sequence[PromptStep]) -> list[Prompt]:
        """:meth:`build` of each step, the prompts that fit tokenized in one call.

        A rollout step builds a prompt per active env; one tokenizer call per prompt takes about twice as long as one
        call for all (docs/guide/speed-cpu.md). A prompt over ``max_prompt_tokens`` goes through :meth:`build`'s
        truncation.
        """
        pairs = [self._pairs(s.past) for s in steps]
        texts = [self._text(s.task_description, s.observation, s.admissible, p, len(s.past)) for s, p in zip(steps, pairs)]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        prompts = []
        for step, shown, text, ids in zip(steps, pairs, texts, encoded):
            ids = list(ids)
            if self._fits(ids):
                prompts.append(Prompt(text=text, ids=ids, n_history_used=len(shown), truncated=False))
            else:
                prompts.append(self._truncated((step.task_description, step.observation, step.admissible), shown,
                                               len(step.past)))
        return prompts

    def _shorten_oldest(
        self, args: tuple[str, str, Sequence[str]], pair: tuple[str, str], n_taken: int
    ) -> tuple[str, list[int]] | None:
        """Keep the longest suffix of the pair's observation that fits (binary search); None if none does."""
        obs, act = pair
        best = None
        lo, hi = 0, len(obs) - 1  # number of trailing characters kept; the full text is known not to fit
        while lo <= hi:
            mid = (lo + hi) // 2
            kept = ELLIPSIS + obs[len(obs) - mid :] if mid > 0 else ELLIPSIS
            text, ids = self._render(*args, [(kept, act)], n_taken)
            if self._fits(ids):
                best = (text, ids)
                lo = mid + 1
            else:
                hi = mid - 1
        return best
