"""The interface the collector drives: batched generation from token ids, and weight sync after updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

DEFAULT_STOP = ("</action>",)  # the answer format ends with this tag: nothing after it is needed
# Response budget per step unless rollout.engine.max_new_tokens says otherwise (the one default: engines and the
# tiny builder take it from here, the model config interpolates the engine's value).
DEFAULT_MAX_NEW_TOKENS = 32


@dataclass
class Generation:
    """One response per prompt, in the order of the prompts.

    ``response_ids`` end with the token that completed the stop string or with eos (both included), or are
    ``max_new_tokens`` long. ``logprobs[i][j]`` is the sampling log-prob of ``response_ids[i][j]``
    (temperature-scaled; greedy decoding reports temperature-1 log-probs). With constrained decoding,
    ``allowed_token_ids[i][j]`` lists the ids that were allowed at that position and ``logprobs`` are those of
    the distribution renormalised over them (None at a free position, e.g. reasoning before the constrained
    ``<action>``); ``allowed_token_ids[i]`` is None for a freely decoded response.
    """

    response_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    n_generated_tokens: int = 0
    allowed_token_ids: list[list[list[int] | None] | None] = field(default_factory=list)
    # Only when the engine generated with the trained actor itself at temperature 1 (HF engine): the final hidden
    # state of each prompt's last token from the prefill ([d] float32), a promise that ``logprobs`` are exactly the
    # actor's (renormalised where constrained), so scoring can reuse both. Empty otherwise (vLLM, T != 1).
    prompt_hidden: list[Any] = field(default_factory=list)


@runtime_checkable
class Engine(Protocol):
    """Rollout generation backend (``conf/rollout/*.yaml`` ``engine:``), built with ``policy=`` at run time.

    ``generate(temperature=...)`` overrides the configured sampling temperature for one call (sampled
    evaluation); ``greedy=True`` wins over it. ``admissible`` and ``task_texts`` (one per prompt: the commands and
    the task's instruction) are what a constrained engine decodes to; a free one ignores them.
    """

    def generate(
        self,
        prompts: list[list[int]],
        greedy: bool = False,
        admissible: Any = None,
        temperature: float | None = None,
        task_texts: Any = None,
    ) -> Generation: ...

    def sync_weights(self, model: Any) -> None:
        """Make generation use ``model``'s current weights; called once per iteration, after the update."""
        ...

    def close(self) -> None: ...


def check_sampling(temperature: float, top_p: float, top_k: int, max_new_tokens: int) -> None:
    """Shared argument checks, so a bad rollout config fails at construction with the field named."""
    if not temperature > 0:
        raise ValueError(
            f"rollout.engine.temperature must be > 0 (greedy is a generate() flag), got {temperature}"
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"rollout.engine.top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"rollout.engine.top_k must be >= 0 (0 = disabled), got {top_k}")
    if max_new_tokens <= 0:
        raise ValueError(f"rollout.engine.max_new_tokens must be > 0, got {max_new_tokens}")
