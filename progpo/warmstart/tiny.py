"""``model=tiny``: build (or load from the cache) a 2.6M-parameter policy warm-started on expert demos.

Fast enough to run the whole RL loop on two CPU cores. Built from scratch in three steps: expert demos on the
training tasks, a byte-level BPE tokenizer trained on their prompts, and a supervised warm start on the same
demos. The result is cached by content (parameters + env identity) and loaded from the cache folder, which is
also what vLLM starts from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import transformers

from envs.base import EnvSuite, tasks_fingerprint
from progpo.config.groups import WarmStartConfig
from progpo.hardware import resolve_precision
from progpo.models.attention import NAME as BF16_MATMUL
from progpo.models.attention import AttentionImplementation, use_attention
from progpo.models.bf16_activations import keep_activations_bf16
from progpo.models.cache import cached_build
from progpo.models.compile import compile_layers
from progpo.models.rotary import use_two_pass_rotary
from progpo.models.tiny import (
    check_reload,
    count_parameters,
    load_tiny,
    save_tokenizer,
    tiny_qwen2,
    train_tokenizer,
)
from progpo.rollout.engines.base import DEFAULT_MAX_NEW_TOKENS
from progpo.rollout.prompt import PROMPT_STYLES, PromptBuilder
from progpo.types import Policy
from progpo.warmstart.demos import DemoStep, collect_demos, collect_focus_demos, response_text
from progpo.warmstart.sft import supervised_finetune

log = logging.getLogger(__name__)

BUILD_VERSION = 4  # bump when the build procedure changes, so old cache entries are not re-used
MIN_TOKENIZER_EPISODES = 16  # demos gathered for the tokenizer corpus even without a warm start
# the second (focus) stage's settings: keyed on top of the first stage's key, never in it, so the first is re-used
_FOCUS_KEYS = ("focus_episodes", "focus_pages", "focus_epochs", "focus_lr", "focus_replay_episodes")


def _corpus(demos: list[DemoStep], history: int, prompt_style: str = "compact") -> list[str]:
    """The tokenizer's training text: every demo's prompt (as RL renders it) and its answer."""
    render = PROMPT_STYLES[prompt_style]
    texts = []
    for d in demos:
        pairs = list(d.past[-history:]) if history > 0 else []
        texts.append(render(d.task_description, d.observation, d.admissible, pairs, len(d.past)))
        texts.append(response_text(d.expert_action))
    return texts


def build_tiny(
    suite: EnvSuite,
    device: str = "cpu",
    name: str = "tiny",
    vocab_size: int = 4096,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 688,
    max_context: int = 2048,
    history: int = 2,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    seed: int = 0,
    warm_start: Mapping[str, Any] | WarmStartConfig | None = None,
    prompt_style: str = "compact",
    constrain_to_admissible: bool = True,
    bracket_words: bool = False,
    attn_implementation: AttentionImplementation = BF16_MATMUL,
    compile: bool = False,
) -> Policy:
    """Build (or load from the cache) the tiny policy for ``suite``.

    Args:
        suite: the environment suite; its ``train_tasks`` and expert provide the tokenizer corpus and demos.
        device: where the returned model lives (the warm start also runs there).
        vocab_size: BPE vocabulary target (fewer if the corpus has fewer merges).
        hidden_size, num_layers, num_heads, intermediate_size: Qwen2 shape (tied embeddings).
        max_context: longest prompt + response the policy is used with.
        history, max_new_tokens: must match the rollout (K pairs, response budget), so the warm start
            sees prompts exactly as RL builds them.
        seed: model initialisation seed.
        warm_start: ``WarmStartConfig`` fields (``n_episodes``, ``epochs``, ``lr``, ``batch_size``,
            ``max_steps``, ``max_episode_steps``, ``action_noise``, ``invalid_noise``, ``seed``).
        prompt_style: ``compact`` (default: no instruction boilerplate, ~half the tokens) or ``paper``;
            RL uses the style the model was warm-started with.
        constrain_to_admissible: the rollout engine decodes only admissible commands for this model
            (a model this small, trained from scratch, learns which command to pick faster than how to spell
            every command of every room); ``rollout.engine.constrain_to_admissible`` overrides it.
        bracket_words: a word inside ``[...]`` tokenises as in running text (``click[grey]`` holds the ``Ġgrey``
            of the instruction, not a token ``[grey`` of its own; :func:`progpo.models.tiny.train_tokenizer`), so
            the model can copy an option or a query word from the instruction into a command. Off by default
            (alone, on WebShop's 1,600-goal warm start, it clicked the instruction's option less often: 34%
            against 43%); ``experiment=webshop_laptop`` turns it on with 8,000 goals (docs/results/webshop_laptop/README.md).
    """
    ws = warm_start if isinstance(warm_start, WarmStartConfig) else WarmStartConfig(**dict(warm_start or {}))
    if max_new_tokens >= max_context:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) must be < model.max_context ({max_context})")
    demo_episodes = max(ws.n_episodes, MIN_TOKENIZER_EPISODES)
    used_tasks = suite.train_tasks[: min(demo_episodes, len(suite.train_tasks))]
    shape = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                 intermediate_size=intermediate_size, max_context=max_context)
    params = {
        "build_version": BUILD_VERSION,
        "shape": shape,
        "history": history,
        "max_new_tokens": max_new_tokens,
        "prompt_style": prompt_style,
        "seed": seed,
        "warm_start": _warm_start_key(ws),
        "env": {"name": suite.name, "train_tasks": tasks_fingerprint(used_tasks), "max_steps": suite.max_steps},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    sft_precision = resolve_precision(ws.precision, uses_cuda=device.startswith("cuda"))
    ws = replace(ws, precision=sft_precision)
    if sft_precision != "32-true":
        params["sft_precision"] = sft_precision
    if bracket_words:  # keyed only when set, so builds cached before the option existed stay valid
        params["tokenizer"] = "bracket_words"
    if suite.name.startswith("webshop"):
        # WebShop demos label the expert's searches, and its item pages show the clicked options ("You have clicked
        # ..."), as WebShop's text mode does: the key keeps builds made without either from being re-used. A key of
        # its own, not a BUILD_VERSION bump, so that every other env's cached builds stay valid.
        params["demos"] = "searches labelled, clicked options shown"

    def build(out: Path) -> dict[str, Any]:
        return _build_into(out, suite, ws, shape, demo_episodes, history, max_new_tokens, prompt_style, seed,
                           device, bracket_words)

    folder = cached_build("tiny", params, build)
    if ws.focus_episodes > 0:  # the second stage, cached on top of the first
        focus_params = {**params, "focus": {k: getattr(ws, k) for k in _FOCUS_KEYS}}

        def build_focus(out: Path) -> dict[str, Any]:
            return _focus_into(out, folder, suite, ws, history, max_new_tokens, prompt_style, max_context, device)

        folder = cached_build("tiny", focus_params, build_focus)
    policy = load_tiny(folder, device=device, name=name, max_context=max_context)
    use_attention(policy.model, attn_implementation)
    keep_activations_bf16(policy.model)
    use_two_pass_rotary(policy.model)
    if compile:
        compile_layers(policy.model)
    policy.prompt_style = prompt_style
    policy.constrain_to_admissible = constrain_to_admissible
    return policy


def _warm_start_key(ws: WarmStartConfig) -> dict[str, Any]:
    """The first stage's part of the cache key. Precision is keyed apart (``sft_precision``, float32 builds keep
    the key they had before it existed); the focus stage is keyed on top (so it re-uses the first stage)."""
    return {k: v for k, v in vars(ws).items() if k != "precision" and k not in _FOCUS_KEYS}


def _focus_into(out: Path, base: Path, suite: EnvSuite, ws: WarmStartConfig, history: int, max_new_tokens: int,
                prompt_style: str, max_context: int, device: str) -> dict[str, Any]:
    """The focus stage: the first stage's model fine-tuned on focus demos + replayed ordinary demos, into ``out``."""
    started = time.perf_counter()
    policy = load_tiny(base, device=device, max_context=max_context)
    focus, focus_stats = collect_focus_demos(suite, ws)
    replay, _ = collect_demos(suite, replace(ws, n_episodes=ws.focus_replay_episodes, seed=ws.seed + 1))
    builder = PromptBuilder(
        policy.tokenizer, history=history, max_prompt_tokens=max_context - max_new_tokens, style=prompt_style
    )
    stage = replace(ws, epochs=ws.focus_epochs, lr=ws.focus_lr, max_steps=None)
    sft = supervised_finetune(policy.model, policy.tokenizer, builder, focus + replay, stage)
    policy.model.to("cpu").save_pretrained(out)
    save_tokenizer(policy.tokenizer, out)
    check_reload(policy.tokenizer, out, [builder.build(d.task_description, d.observation, d.admissible, d.past).text
                                         for d in focus[:: max(1, len(focus) // 50)]])
    labels = [d.expert_action for d in focus]
    summary = {
        "base": base.name,
        "focus_episodes": focus_stats.episodes,
        "focus_demo_steps": len(focus),
        "focus_pages": list(ws.focus_pages),
        "focus_distinct_labels": len(set(labels)),
        "focus_expert_won": focus_stats.won,
        "replay_demo_steps": len(replay),
        "build_seconds": time.perf_counter() - started,
        **sft,
    }
    log.info("tiny model focus stage built: %s", summary)
    return summary


def _build_into(out: Path, suite: EnvSuite, ws: WarmStartConfig, shape: dict[str, int], demo_episodes: int,
                history: int, max_new_tokens: int, prompt_style: str, seed: int, device: str,
                bracket_words: bool = False) -> dict[str, Any]:
    """Demos -> tokenizer -> model -> warm start, saved into ``out``; returns the build summary."""
    vocab_size, max_context = shape["vocab_size"], shape["max_context"]
    started = time.perf_counter()
    demos, stats = collect_demos(suite, WarmStartConfig(**{**vars(ws), "n_episodes": demo_episodes}))
    demos_for_sft = [d for d in demos if d.episode < ws.n_episodes]  # the rest only feed the tokenizer
    demo_seconds = time.perf_counter() - started
    corpus = _corpus(demos, history, prompt_style)
    tokenizer = train_tokenizer(corpus, vocab_size, max_context, bracket_words=bracket_words)
    model = tiny_qwen2(tokenizer, shape["hidden_size"], shape["num_layers"], shape["num_heads"],
                       shape["intermediate_size"], max_context, seed, device)
    builder = PromptBuilder(
        tokenizer, history=history, max_prompt_tokens=max_context - max_new_tokens, style=prompt_style
    )
    model.config.save_pretrained(out)  # the model type decides which tokenizer class AutoTokenizer picks
    save_tokenizer(tokenizer, out)
    sample = corpus[:: max(1, len(corpus) // 200)]
    if demos:
        d = demos[-1]
        sample.append(builder.build(d.task_description, d.observation, d.admissible, d.past).text)
    check_reload(tokenizer, out, sample)
    sft = supervised_finetune(model, tokenizer, builder, demos_for_sft, ws)
    model.to("cpu").save_pretrained(out)
    summary = {
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "demo_episodes": stats.episodes,
        "demo_steps": stats.steps,
        "sft_episodes": ws.n_episodes,
        "sft_demo_steps": len(demos_for_sft),
        "demo_noisy_steps": stats.noisy_steps,
        "demo_invalid_steps": stats.invalid_steps,
        "demo_won": stats.won,
        "demo_seconds": demo_seconds,
        "build_seconds": time.perf_counter() - started,
        **sft,
    }
    log.info("tiny model built: %s", summary)
    return summary
